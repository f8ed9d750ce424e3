"""User-facing errors: one line that says what is wrong and what to do. The CLI prints the message
alone (no traceback) and exits non-zero."""


class DeployError(Exception):
    pass
