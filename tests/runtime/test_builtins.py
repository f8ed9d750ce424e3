"""One table of VM builtins (runtime/vm.py BUILTIN_TABLE): the emitter, the VM, the validator, the C lowering and
the browser runtime name the same builtins. Each side is read where it dispatches on a builtin's name, so a builtin
added to one and not to the others fails here, not in a user's package."""
from __future__ import annotations

import re
from pathlib import Path

import deploycc
from deploycc.runtime import vm
from deploycc.runtime.native import PROLOGUE
from deploycc.runtime.validate_bytecode import KINDS

ROOT = Path(deploycc.__file__).resolve().parent
RUNTIME = Path(vm.__file__).resolve().parent
NAME = r'"((?:vm|kv)\.[a-z_]+)"'


def names(path: Path, before: str) -> set[str]:
    """The builtin names `path` compares or passes right after `before` (a regex)."""
    return set(re.findall(before + NAME, path.read_text()))


def test_every_side_names_the_table():
    """The emitter emits every builtin; the VM runs (RUNS), the dry run checks (a method per builtin) and the C
    lowering treats (LOWERING) every one and no other."""
    from deploycc.runtime.dryrun import _DryRun
    from deploycc.vm.capture import LOWERING

    table = set(vm.BUILTIN_TABLE)
    assert names(ROOT / "vm" / "lower.py", r"self\.emit\(") == table
    assert set(vm.RUNS) == table
    assert {n for n in table if callable(getattr(_DryRun, n.replace(".", "_"), None))} == table
    assert set(LOWERING) == table
    prologue = {n for n, how in LOWERING.items() if how == "prologue"}
    assert prologue <= set(PROLOGUE), "a builtin the C lowering leaves to the prologue must be one the prologue runs"


def test_the_browser_runtime_runs_the_builtins_of_one_sequence():
    """web/deploycc.js runs prefill and decode (one sequence; a page pool's batched step is the server's): its
    BUILTINS are the table's builtins that are not `paged`, and its VM has a case for each."""
    js = (ROOT / "web" / "deploycc.js").read_text()
    declared = re.search(r"const BUILTINS = new Set\(\[(.*?)\]\)", js, re.S)
    assert declared, "deploycc.js declares no BUILTINS set"
    browser = set(re.findall(NAME, declared.group(1)))
    assert browser == {n for n, b in vm.BUILTIN_TABLE.items() if not b.paged}
    assert set(re.findall(r"case " + NAME, js)) == browser


def test_operand_kinds_are_known():
    kinds = {"r", "i", "s", "str", "k"}
    for name, b in vm.BUILTIN_TABLE.items():
        assert set(b.operands) <= kinds, name
        assert b.more is None or b.more in KINDS or b.more in kinds, name
