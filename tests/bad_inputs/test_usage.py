"""Catalogue: bad command lines (a value of the wrong type, a missing argument, an unknown command) are one
`error:` line naming what is wrong and the --help to read, exit code 2 (the usage-error convention), in both
command lines: `deploycc` (click) and a package's own `python PKG` (argparse)."""
from __future__ import annotations

from pathlib import Path

import pytest

from bad_inputs.common import assert_one_line_error, cli, run_package
from fixtures import make_tiny


@pytest.mark.parametrize("args,fragments", [
    (("compile", "MODEL", "--context-window", "1e12"), ["'--context-window'", "deploycc compile --help'"]),
    (("compile", "MODEL", "--context-window", "0"), ["'--context-window'"]),
    (("compile",), ["Missing argument 'MODEL'"]),
    (("frobnicate",), ["No such command 'frobnicate'", "deploycc --help'"]),
    (("run", "MODEL", "--prompt", "hi", "--max-tokens", "many"), ["'--max-tokens'"]),
    (("run", "MODEL", "--prompt", "hi", "--top-p", "1.5"), ["'--top-p'"]),
    (("inspect", "MODEL", "--stage", "nonsense"), ["'--stage'"]),
    (("compile", "MODEL", "--no-such-option"), ["No such option", "--no-such-option"]),
])
def test_deploycc_usage(args, fragments):
    model = str(make_tiny("llama-gqa1"))
    assert_one_line_error(cli(*(model if a == "MODEL" else a for a in args)), *fragments, code=2)


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    from tiny_package import compile_tiny_package

    return compile_tiny_package(tmp_path_factory.mktemp("usage"))


@pytest.mark.parametrize("args,fragments", [
    ((), ["the following arguments are required"]),
    (("run",), ["--prompt"]),
    (("run", "--prompt", "hi", "--max-tokens", "many"), ["--max-tokens", "invalid int value"]),
    (("frobnicate",), ["invalid choice: 'frobnicate'"]),
    (("serve", "--port", "seventy"), ["--port", "invalid int value"]),
])
def test_package_usage(package, args, fragments):
    assert_one_line_error(run_package(package, *args), *fragments, "--help'", code=2)
