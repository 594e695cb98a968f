"""One object for a parameter list on the wire: a deployment packs a legacy message's arrays.

Flower 1.41-1.42 sends a message as a tree of objects (message, records, each Array and each
chunk of it), and every object is pushed and pulled with an HTTP request of its own at every
hop: ServerApp -> SuperLink -> SuperNode -> ClientApp, and back. A legacy strategy's
`Parameters` becomes one Array per tensor, one chunk each, so a fit instruction of the FMNIST
preset (10 tensors) is 24 objects, 20 of them its arrays. On 20 SuperNodes sharing 2 cores
these requests, not the bytes, were most of what a deployed round cost beyond the simulated one
(docs/PERFORMANCE.md, "One object for the model's arrays").

So a deployed ServerApp (strategies/replies.py) packs every legacy-shaped ArrayRecord of an
instruction into one Array before pushing it: the tensors' serialized bytes one after another,
their lengths as its shape (each message's content is put back once it is pushed, so the
packed copy lasts only the push); the ClientApp's mod (`packed_arrays_mod`, fedapps/client_app.py)
unpacks it before Flower's compat layer reads it, and packs the answer's arrays when the
instruction came packed; the ServerApp unpacks the answer as it pulls it. The bytes, their
order and their keys come out as they went in, so the client and the strategy see exactly what
they would unpacked (and the upload check still decodes every array itself). The simulation
sends no objects and is left as it is.
"""

from __future__ import annotations

from collections.abc import Callable

from flwr.app import Array, ArrayRecord, Context, Message, RecordDict

PACKED_KEY = "fedapps.packed"
STYPE_PREFIX = "fedapps.packed:"  # + the tensors' own stype (Flower's "numpy.ndarray")
# Far more tensors than any model here has (PreResNet18: 56): a reply claiming more is
# refused before an object is made for each (a few kB of lengths could otherwise make a server
# build millions of them).
MAX_PACKED_TENSORS = 10_000


class PackingError(ValueError):
    """A packed record whose lengths do not describe its bytes."""


def is_legacy(record: ArrayRecord) -> bool:
    """Shaped as Flower's compat layer writes a `Parameters` of two or more tensors: keys
    "0".."n-1" in order, each Array only serialized bytes (no dtype, no shape), one stype."""
    arrays = list(record.values())
    if len(arrays) < 2 or list(record.keys()) != [str(i) for i in range(len(arrays))]:
        return False
    stype = arrays[0].stype
    return not stype.startswith(STYPE_PREFIX) and all(
        a.dtype == "" and tuple(a.shape) == () and a.stype == stype for a in arrays)


def is_packed(record: ArrayRecord) -> bool:
    """Packed by `pack_record` (or claiming to be: `unpack_record` checks the rest)."""
    return list(record.keys()) == [PACKED_KEY]


def pack_record(record: ArrayRecord) -> ArrayRecord:
    """One Array holding a legacy record's tensors (`is_legacy`)."""
    arrays = list(record.values())
    packed = Array(dtype="", shape=tuple(len(a.data) for a in arrays),
                   stype=STYPE_PREFIX + arrays[0].stype, data=b"".join(a.data for a in arrays))
    return ArrayRecord(array_dict={PACKED_KEY: packed})


def unpack_record(record: ArrayRecord) -> ArrayRecord:
    """The legacy record `pack_record` packed; PackingError if its lengths do not add up."""
    packed = record[PACKED_KEY]
    lengths, data = tuple(packed.shape), packed.data
    if not packed.stype.startswith(STYPE_PREFIX):
        raise PackingError(f"stype {packed.stype!r} is not a packed one")
    if len(lengths) > MAX_PACKED_TENSORS:
        raise PackingError(f"{len(lengths)} tensors, more than {MAX_PACKED_TENSORS}")
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in lengths) \
            or sum(lengths) != len(data):
        raise PackingError(f"{len(lengths)} lengths adding up to {sum(lengths)} for "
                           f"{len(data)} bytes")
    stype, view, start, arrays = packed.stype[len(STYPE_PREFIX):], memoryview(data), 0, {}
    for i, n in enumerate(lengths):
        arrays[str(i)] = Array(dtype="", shape=(), stype=stype, data=bytes(view[start:start + n]))
        start += n
    return ArrayRecord(array_dict=arrays)


def pack_content(content: RecordDict) -> dict[str, ArrayRecord]:
    """Pack every legacy ArrayRecord of `content` in place; the records packed, by key (to put
    back once the message is sent, so the packed copy of the bytes does not outlive it)."""
    packed = {k: r for k, r in content.array_records.items() if is_legacy(r)}
    for key, record in packed.items():
        content[key] = pack_record(record)
    return packed


def unpack_content(content: RecordDict) -> int:
    """Unpack every packed ArrayRecord of `content` in place; how many were packed."""
    keys = [k for k, r in content.array_records.items() if is_packed(r)]
    for key in keys:
        content[key] = unpack_record(content.array_records[key])
    return len(keys)


def packed_arrays_mod(message: Message, context: Context,
                      call_next: Callable[[Message, Context], Message]) -> Message:
    """ClientApp mod: unpack an instruction's arrays for the client, and pack its answer's
    when the instruction came packed (a deployed fedapps ServerApp unpacks it)."""
    packed = message.has_content() and unpack_content(message.content) > 0
    reply = call_next(message, context)
    if packed and reply.has_content():
        pack_content(reply.content)  # the reply leaves this process: nothing to put back
    return reply
