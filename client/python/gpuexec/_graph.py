"""Graphs: a session's launches, memsets and copies recorded once, built on
its device as one CUDA graph, and replayed in one call, with new arguments
where asked.

    with session.graph() as g:
        scale.launch_async(grid, block, g.arg("x", x), y, n)
        y.copy_to(z)
    g()                      # replays as recorded
    g(x=other)               # replays with argument "x" patched
    g.launch(patches=[(0, 2, gpuexec.u64(512))])   # (node, argument, value)

Between ``with`` and its end the session's work is recorded, not run
(Session.graph says what is refused meanwhile). The graph's nodes are
counted from 0 in the order recorded: each launch, memset and copy is one.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import grpc

from . import _ring, _ring_records, _wire
from ._args import Arg, to_arg
from ._errors import Error, client_error
from ._transfer import clipped_repr
from .v1 import gpuexec_pb2 as pb

# The daemon's bound on a replay's patches (LaunchGraphRequest).
MAX_PATCHES = 1024
# Arguments a launch may have (the daemon's bound).
_MAX_ARGUMENTS = 4096
# The longest placeholder name kept (a name is the caller's, shown back).
_MAX_NAME = 64


class Placeholder:
    """An argument of a recorded launch given a name (Graph.arg): it is
    recorded with ``value``, and a replay may give it another by name."""

    __slots__ = ("graph", "name", "value")

    def __init__(self, graph: Graph, name: str, value: Any) -> None:
        self.graph = graph
        self.name = name
        self.value = value

    def __repr__(self) -> str:
        return f"<gpuexec graph argument {self.name!r}: {clipped_repr(self.value)}>"

    def resolve(self, function: Any, index: int) -> Any:
        """The Arg to launch with now, argument ``index`` of ``function``;
        notes where the name is used in the graph being recorded."""
        rec = self.graph._recording
        if rec is None or function.session is not self.graph.session:
            raise client_error(
                f"graph argument {self.name!r} passed to kernel {function._shown_name} outside "
                f"the recording of its graph: use it inside `with session.graph() as g:` of the "
                f"same session")
        arg = function._arg(self.value, index)
        rec.pending.append((self.name, index))
        return arg


class _Recording:
    """What the client keeps of a graph while it records: how many nodes
    were recorded, each kernel node's function (to convert a patch's value
    as its launch would), and where each named argument went."""

    __slots__ = ("nodes", "kernels", "uses", "pending")

    def __init__(self) -> None:
        self.nodes = 0
        self.kernels: Dict[int, Any] = {}
        self.uses: Dict[str, Set[Tuple[int, int]]] = {}
        # The named arguments of the launch being sent: kept once it is.
        self.pending: List[Tuple[str, int]] = []

    def begin(self) -> None:
        """A launch is about to be built: what an earlier one that failed
        here left is dropped."""
        self.pending.clear()

    def recorded(self, function: Any = None) -> None:
        """A launch (with its function, whose named arguments are kept), a
        memset, a copy or a Triton launch (None) was recorded."""
        if function is not None:
            self.kernels[self.nodes] = function
            for name, index in self.pending:
                self.uses.setdefault(name, set()).add((self.nodes, index))
        self.pending.clear()
        self.nodes += 1


class Graph:
    """A session's recorded work built as one CUDA graph (Session.graph).
    The session owns it: it goes with the session, or with free()."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.handle = 0
        # The node count and the seconds the daemon took to build,
        # instantiate and upload it, once recorded.
        self.nodes = 0
        self.instantiate_time = 0.0
        self._recording: Optional[_Recording] = None
        self._kernels: Dict[int, Any] = {}
        self._uses: Dict[str, List[Tuple[int, int]]] = {}
        self._freed = False

    def __repr__(self) -> str:
        state = "recording" if self._recording is not None else (
            "freed" if self._freed else f"{self.nodes} nodes")
        return f"<gpuexec.Graph {self.handle} of {self.session!r}: {state}>"

    def arg(self, name: str, value: Any) -> Placeholder:
        """``value``, to pass as a launch's argument while recording, named
        ``name`` so that a replay may patch it: ``g(name=new_value)``."""
        if (not isinstance(name, str) or not name.isidentifier() or len(name) > _MAX_NAME
                or name in ("patches", "sync")):
            raise client_error(f"graph argument name {clipped_repr(name)}: a Python identifier "
                               f"of at most {_MAX_NAME} characters other than 'patches' and "
                               f"'sync', for a replay's g(name=value)")
        return Placeholder(self, name, value)

    # ------------------------------------------------------------ recording

    def __enter__(self) -> Graph:
        session = self.session
        if session._recording is not None:
            raise client_error(f"{session!r} is recording a graph already: end it (leave its "
                               f"`with` block) before another")
        if self.handle or self._freed:
            raise client_error(f"{self!r} was recorded already: make another with "
                               f"session.graph()")
        session._order()  # the work queued before runs, what follows is recorded
        session._control(session.client.stub.BeginGraph,
                         pb.BeginGraphRequest(session=session.token))
        self._recording = session._recording = _Recording()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        session = self.session
        rec, self._recording, session._recording = self._recording, None, None
        recorded: Optional[Error] = None
        try:
            session._order()  # every recorded command reached the daemon
        except Error as e:
            recorded = e
        try:
            response = session._data(session.client.stub.EndGraph,
                                     pb.EndGraphRequest(session=session.token))
        except Error:
            if exc is not None:
                return  # the block's own exception says more
            if recorded is not None:
                raise recorded from None  # the refusal the daemon remembered
            raise
        self.handle = response.graph
        self.nodes = response.nodes
        self.instantiate_time = response.instantiate_ns / 1e9
        if rec is not None:
            self._kernels = rec.kernels
            self._uses = {name: sorted(at) for name, at in rec.uses.items()}
        drift = None
        if rec is not None and rec.nodes != response.nodes and exc is None and recorded is None:
            # A command refused without a word to this client (caught in the
            # block, say) would shift every node after it: patches by index
            # or name would land on the wrong one.
            drift = client_error(
                f"the graph of {session!r} has {response.nodes} nodes where this client recorded "
                f"{rec.nodes}: a command was refused while recording (was an error caught inside "
                f"the block?); no graph is kept: record it again",
                grpc.StatusCode.FAILED_PRECONDITION)
        if exc is not None or recorded is not None or drift is not None:
            try:
                self.free()
            except Error:
                pass
            failure = recorded if recorded is not None else drift
            if exc is None and failure is not None:
                raise failure

    # ------------------------------------------------------------ replays

    def _patch(self, node: Any, argument: Any, value: Any) -> Any:
        if (not isinstance(node, int) or not isinstance(argument, int)
                or not 0 <= node < self.nodes or not 0 <= argument < _MAX_ARGUMENTS):
            raise client_error(f"patch of {self!r}: (node, argument, value) with node from 0 "
                               f"to {self.nodes - 1} and argument from 0, got "
                               f"({clipped_repr(node)}, {clipped_repr(argument)}, ...)")
        function = self._kernels.get(node)
        if function is None:
            arg = value if isinstance(value, Arg) else to_arg(value, argument, None,
                                                              f"node {node}")
        else:
            arg = function._arg(value, argument)
        return node, argument, arg

    def _patches(self, patches: Sequence[Any], named: Dict[str, Any]) -> List[Tuple[int, int, Any]]:
        if self._recording is not None:
            raise client_error(f"{self!r} is still recording: replay it after its `with` block")
        if not self.handle:
            raise client_error(f"{self!r} has no graph: it was freed, or its recording failed")
        out = [self._patch(*p) for p in patches]
        for name, value in named.items():
            at = self._uses.get(name)
            if at is None:
                known = ", ".join(sorted(self._uses)) or "none"
                raise client_error(f"{self!r} has no argument named {clipped_repr(name)} "
                                   f"(its names: {clipped_repr(known)}); name one with "
                                   f"g.arg(name, value) while recording")
            out.extend(self._patch(node, index, value) for node, index in at)
        if len(out) > MAX_PATCHES:
            raise client_error(f"a replay of {self!r} patches {len(out)} arguments, more than "
                               f"the {MAX_PATCHES} one replay may: patch fewer, or give fewer "
                               f"nodes one name")
        return out

    def launch(self, patches: Sequence[Tuple[int, int, Any]] = (), *, sync: bool = False,
               **named: Any) -> Optional[float]:
        """Replays the graph on the session's stream after the work sent
        before it. ``patches``: (node, argument, value) triples; ``named``:
        values for the names given with arg(). Each new value is checked as
        the launch's argument was and lasts for the replays after this one;
        a refused patch leaves the graph as it was. Returns at once, as
        launch_async does (a refusal is raised by the session's next call
        that waits); with ``sync`` waits for the session's work and returns
        its GPU time in seconds."""
        return self._replay(patches, named, sync)

    def __call__(self, /, **named: Any) -> None:
        """Replays it with the named arguments given (see launch)."""
        self._replay((), named, False)

    def _replay(self, patches: Sequence[Any], named: Dict[str, Any], sync: bool) -> Any:
        out = self._patches(patches, named)
        request = pb.LaunchGraphRequest(
            graph=self.handle, synchronize=sync,
            patches=[pb.GraphPatch(node=n, argument=a, value=arg.to_proto()) for n, a, arg in out])
        session = self.session
        # On the session's commands, in order with its launches: Command's
        # launch_graph field (number 11), or a record on its command ring.
        op = _wire.field_bytes(b"\x5a", request.SerializeToString())
        body = _ring_records.launch_graph_body(self.handle, out, sync)
        record = (_ring.LAUNCH_GRAPH, body) if body is not None else None
        try:
            result = session._commands.submit(op, wait=sync, record=record)
        except Error as e:
            raise session._failed(e) from None
        return result.gpu_time_ns / 1e9 if sync else None

    def free(self) -> None:
        """Frees it on the daemon; the buffers it used may be freed then."""
        if not self.handle:
            return
        session = self.session
        session._order()
        session._control(session.client.stub.FreeGraph,
                         pb.FreeGraphRequest(session=session.token, graph=self.handle))
        self.handle = 0
        self._freed = True
