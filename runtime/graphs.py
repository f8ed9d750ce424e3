"""CUDA graphs for a step function: Relax's graph capture and replay, at run time, for the decode and batched steps.

A decode step of a CUDA package is hundreds of launches, and the Python VM with CuPy spends about 9 us of host time
on each (measured on an H100: docs/gpu.md), as long as the GPU takes for the whole step of a small model. A CUDA
graph is the step captured once and then enqueued with one call.

A step's key is its inputs' buffers and the work-group counts that depend on its shapes (runtime/vm.py:
VM._run_graphs). A step whose key has a graph runs only the bytecode's prologue (it binds and checks the shapes and
begins the cache's step), evaluates the graph's int arguments from the shapes (`replay`) and runs the instructions its
returned value depends on. A step whose key has none runs the rest of its bytecode with `vm.recording` set, each
launch site appending its launch to a list instead of launching, and `run` launches the list:
- a graph keeps its launches' arguments, and a decode step's int arguments change every step (the tokens cached).
  So the graph's kernels are variants that read their int arguments from a device table (graph_source,
  runtime/devices/cuda.py), and the host writes the step's ints into the table before each replay, on the same
  stream, so they are in place before any kernel reads them;
- a step whose launches differ in anything else (a kernel, a grid, a buffer: the split attention takes one more
  block a head every 256 keys on h100; the server's step, its rows and its widest page table) gets a graph of its
  own, captured the second time it is seen (a step seen once is launched kernel by kernel): at most `limit` per
  function are kept, the least recently used dropped first;
- a step is launched without a graph when the device has none (the kind's capture failed: the first failure is
  reported once on stderr and the step launched as before, through its launch sites).

What the emulation (runtime/devices/cuda_emu.py) checks of this: the graph variants' text and the ints they read,
the keys, the table written before each replay (tests/runtime/test_cuda_graphs.py: logits the same bit for bit
as launch by launch, and a replay with a stale table wrong). What only a GPU can: CuPy's capture and launch.
"""
from __future__ import annotations

import sys
from collections import OrderedDict

import numpy as np

SEEN = 256


class StepGraphs:
    """The graphs of one step function on one CUDA device, by the step's key: the inputs' buffers and the work-group
    counts of the launch sites whose counts depend on the shapes (runtime/vm.py: VM._run_graphs)."""

    def __init__(self, device, name: str, limit: int = 32):
        self.device, self.name, self.limit = device, name, limit
        self.graphs: OrderedDict = OrderedDict()  # key -> Graph
        self.seen: OrderedDict = OrderedDict()  # keys seen once, launched without a graph (at most SEEN, the oldest go)
        self.variants: dict = {}  # kernel name -> graph variant
        self.captured = 0
        self.replayed = 0
        self.failed: str | None = None

    def replay(self, key, heap: list) -> int | None:
        """Launch the graph of `key` with the int arguments the shapes in `heap` give: its launches' count, or None
        when there is no graph for it (the step then runs its launches and `run` makes one)."""
        graph = self.graphs.get(key)
        if graph is None:
            return None
        self.graphs.move_to_end(key)
        if graph.scalars:
            self.set_ints(graph.table, [f(heap) for f in graph.scalars])
        graph.launch()
        self.replayed += 1
        return graph.count

    def run(self, key, launches: list) -> None:
        """Capture one step's recorded launches ((kernel, grid, block, buffers, ints, int closures, launch site)
        each) as the graph of `key` and launch it, the second time the key is seen; the first time, or where the
        device's capture failed, launch them one by one through their sites (a shape seen once, such as a prompt's
        last chunk, costs no capture)."""
        again = key in self.seen
        self.seen[key] = True
        if len(self.seen) > SEEN:
            self.seen.popitem(last=False)
        if self.failed is None and again:
            try:
                graph = self._capture(launches)
            except Exception as e:  # noqa: BLE001  (a kind's capture that fails: launched as before, said once)
                self.failed = f"{type(e).__name__}: {e}"
                print(f"deploycc: CUDA graphs are off for {self.name} ({self.failed}); launching kernel by kernel",
                      file=sys.stderr)
            else:
                self.graphs[key] = graph
                if len(self.graphs) > self.limit:
                    self.graphs.popitem(last=False)
                if graph.scalars:
                    self.set_ints(graph.table, [i for x in launches for i in x[4]])
                graph.launch()
                return
        for _, grid, block, bufs, ints, _, site in launches:  # through the launch sites, as the VM launches
            site(bufs, ints, grid, block)

    def set_ints(self, table, ints: list[int]) -> None:
        """The step's int arguments into the graph's table, on the stream the graph is launched on, before it."""
        self.device.write(table, np.asarray(ints, np.int32))

    def _capture(self, launches: list) -> Graph:
        need = list({k.name: k for k, _, _, _, ints, *_ in launches if ints and k.name not in self.variants}.values())
        if need:
            self.variants |= self.device.graph_kernels(need)
        scalars = [f for x in launches if x[4] for f in x[5]]
        table = self.device.alloc(4 * max(1, len(scalars)))
        calls, at = [], 0
        for kernel, grid, block, bufs, ints, *_ in launches:
            args = [b.handle for b in bufs]
            if ints:
                calls.append((self.variants[kernel.name].handle, grid, block, (*args, table.handle, np.int32(at))))
                at += len(ints)
            else:
                calls.append((kernel.handle, grid, block, tuple(args)))
        graph = Graph(self.device.capture(calls), table, scalars, len(launches), launches)
        self.captured += 1
        return graph

    def stats(self) -> dict:
        return {"captured": self.captured, "replayed": self.replayed, "kept": len(self.graphs),
                **({"failed": self.failed} if self.failed else {})}


class Graph:
    """A captured step: `launch()`, the table its kernels read their ints from, the closures that give those ints
    from the shapes, its launches' count, and the recording (it keeps alive the buffers whose ids key the graph)."""

    __slots__ = ("launch", "table", "scalars", "count", "recording")

    def __init__(self, launch, table, scalars: list, count: int, recording: list):
        self.launch, self.table, self.scalars, self.count, self.recording = launch, table, scalars, count, recording
