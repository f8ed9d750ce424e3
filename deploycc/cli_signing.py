"""The command line of signed packages: `deploycc keygen`, `deploycc sign`, and the --trust option of the commands
that load a package (deploycc/cli.py registers them). The work is in deploycc/signing.py and runtime/trust.py."""
from __future__ import annotations

import os
from pathlib import Path

import click

from .runtime.trust import ENV, make_policy


def trust_option(f):
    """--trust KEY.pub (repeatable): a decorator for the commands that load a package."""
    return click.option("--trust", "trust", multiple=True, metavar="KEY.pub",
                        help=f"Load the package only if it is signed by this public key (repeatable; ${ENV}, a "
                             f"{os.pathsep}-separated path list, adds keys). Checked before any kernel is built or "
                             f"native code is mapped.")(f)


def trust_policy(trust: tuple[str, ...]):
    """The policy of --trust and DEPLOYCC_TRUSTED_KEYS (None: no policy, signatures not looked at); every key is
    read now, before any work."""
    return make_policy(trust, os.environ.get(ENV))


@click.command(short_help="Make an Ed25519 key pair for signing packages.")
@click.argument("out", type=click.Path(dir_okay=False))
def keygen(out):
    """Write the private key OUT (PEM, mode 0600, unencrypted: keep it secret) and the public key OUT.pub (PEM: give
    it to whoever runs your packages, for --trust). Existing files are never overwritten."""
    from .signing import keygen as make_pair

    private, public, kid = make_pair(Path(out).expanduser())
    click.echo(f"private key {private} (keep it secret; deploycc compile --sign {private})")
    click.echo(f"public key  {public} (for --trust {public})")
    click.echo(f"key id      {kid}")


@click.command(short_help="Sign a compiled package with a private key.")
@click.argument("package", type=click.Path(file_okay=False))
@click.option("--key", required=True, metavar="KEY", help="The private key file (deploycc keygen writes one).")
def sign(package, key):
    """Write PACKAGE/signature.json: Ed25519 over its sealed manifest, which holds the sha256 of every file. The
    package must check whole first (seal, every file's sha256, schema); a signature already there is replaced."""
    from .signing import sign_package

    kid = sign_package(Path(package), Path(key))
    click.echo(f"signed {package} with key {kid}")
