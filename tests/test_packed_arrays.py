"""A deployment's legacy arrays travel as one object and come back byte for byte
(fedapps/packed_arrays.py): packed by the deployed ServerApp's grid and the ClientApp's mod,
unpacked on the other side, malformed packing refused."""

import logging

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.common import FitIns, FitRes, Parameters, Status, ndarrays_to_parameters
from flwr.common.typing import Code
from flwr.compat.common.recorddict_compat import (
    arrayrecord_to_parameters,
    fitins_to_recorddict,
    fitres_to_recorddict,
    parameters_to_arrayrecord,
    recorddict_to_fitins,
)
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents

from fedapps.packed_arrays import (
    PACKED_KEY,
    PackingError,
    is_legacy,
    pack_content,
    pack_record,
    packed_arrays_mod,
    unpack_content,
    unpack_record,
)
from strategies.replies import PromptReplies

ARRAYS = [np.arange(12, dtype=np.float32).reshape(3, 4), np.array([7, -1], dtype=np.int64),
          np.zeros((0, 5), dtype=np.float64), np.array([True, False]),
          np.full((2, 2, 2), 0.5, dtype=np.float16)]


@pytest.fixture
def in_a_task(monkeypatch):
    """Messages are built inside a Flower task (run, node and task ids)."""
    from flwr.supercore.task_identity import TaskIdentity

    for name in ("_run_id", "_node_id", "_task_id"):
        monkeypatch.setattr(TaskIdentity, name, 1)


def fit_content(config=None):
    return fitins_to_recorddict(FitIns(ndarrays_to_parameters(ARRAYS), config or {"lr": 0.1}),
                                keep_input=True)


def over_the_wire(message):
    """The message as a receiver inflates it from its objects' bytes."""
    contents = {k: v.deflate() for k, v in get_all_nested_objects(message).items()}
    return inflate_object_from_contents(message.object_id, contents)


def test_a_legacy_parameter_list_travels_as_one_array_and_comes_back_byte_for_byte(in_a_task):
    content = fit_content({"lr": 0.1, "server-round": 3})
    sent = fitins_to_recorddict(FitIns(ndarrays_to_parameters(ARRAYS), {}), keep_input=True)
    before = len(get_all_nested_objects(content["fitins.parameters"]))
    assert before == 1 + 2 * len(ARRAYS)  # the record, an Array and a chunk per tensor
    assert list(pack_content(content)) == ["fitins.parameters"]
    record = content["fitins.parameters"]
    assert list(record.keys()) == [PACKED_KEY]
    assert len(get_all_nested_objects(record)) == 3  # the record, one Array, one chunk
    assert tuple(record[PACKED_KEY].shape) == tuple(len(a.data) for a in
                                                    sent["fitins.parameters"].values())

    arrived = over_the_wire(Message(content, dst_node_id=2, message_type="train"))
    assert unpack_content(arrived.content) == 1
    ins = recorddict_to_fitins(arrived.content, keep_input=True)
    expected = ndarrays_to_parameters(ARRAYS)
    assert ins.parameters.tensors == expected.tensors  # the same bytes, in the same order
    assert ins.parameters.tensor_type == expected.tensor_type == "numpy.ndarray"
    assert ins.config == {"lr": 0.1, "server-round": 3}


def test_what_is_not_a_legacy_parameter_list_is_left_alone():
    legacy = fit_content()["fitins.parameters"]
    one = ArrayRecord(array_dict={"0": legacy["0"]})
    typed = ArrayRecord(ARRAYS[:2])  # Arrays with their dtype and shape: not compat's
    renamed = ArrayRecord(array_dict={"1": legacy["0"], "0": legacy["1"]})
    mixed = ArrayRecord(array_dict={"0": legacy["0"], "1": Array(dtype="", shape=(),
                                                                 stype="other", data=b"x")})
    empty = parameters_to_arrayrecord(Parameters([], "numpy.ndarray"), keep_input=True)
    for record in (one, typed, renamed, mixed, empty, pack_record(legacy)):
        assert not is_legacy(record)
    content = RecordDict({"a": one, "b": typed, "c": renamed, "d": mixed,
                          "e": ConfigRecord({"k": 1})})
    assert pack_content(content) == {}
    assert content["a"] is one and content["b"] is typed and content["d"] is mixed
    assert unpack_content(content) == 0


@pytest.mark.parametrize("shape, stype, why", [
    ((3, 3), "fedapps.packed:numpy.ndarray", "adding up to 6 for 7 bytes"),
    ((8, -1), "fedapps.packed:numpy.ndarray", "adding up to 7"),
    ((7,), "numpy.ndarray", "not a packed one"),
    ((0,) * 10_000 + (7,), "fedapps.packed:numpy.ndarray", "10001 tensors, more than 10000"),
    ((True, 6), "fedapps.packed:numpy.ndarray", "adding up to 7"),  # a bool is no length
])
def test_malformed_packing_is_refused(shape, stype, why):
    record = ArrayRecord(array_dict={PACKED_KEY: Array(dtype="", shape=shape, stype=stype,
                                                       data=b"1234567")})
    with pytest.raises(PackingError, match=why):
        unpack_record(record)


def reply_to(message):
    res = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(ARRAYS[::-1]), 4, {"loss": 1.0})
    return Message(fitres_to_recorddict(res, keep_input=True), reply_to=message)


def test_the_client_mod_unpacks_for_the_client_and_packs_its_answer(in_a_task):
    seen = []

    def client(message, context):
        seen.append(list(message.content["fitins.parameters"].keys()))
        return reply_to(message)

    packed = fit_content()
    pack_content(packed)
    answer = packed_arrays_mod(Message(packed, dst_node_id=2, message_type="train"), None, client)
    assert seen == [[str(i) for i in range(len(ARRAYS))]]  # the client saw compat's record
    assert list(answer.content["fitres.parameters"].keys()) == [PACKED_KEY]
    unpack_content(answer.content)
    assert arrayrecord_to_parameters(answer.content["fitres.parameters"], keep_input=True
                                     ).tensors == ndarrays_to_parameters(ARRAYS[::-1]).tensors

    # an instruction that came unpacked (a simulation) gets its answer unpacked
    answer = packed_arrays_mod(Message(fit_content(), dst_node_id=2, message_type="train"),
                               None, client)
    assert is_legacy(answer.content["fitres.parameters"])


class Grid:
    """Records the keys of what is pushed, as pushed; answers a pull with the given replies."""

    def __init__(self, replies=()):
        self.pushed, self.replies = [], list(replies)

    def push_messages(self, messages):
        self.pushed.extend(list(m.content["fitins.parameters"].keys()) for m in messages)
        return [str(i) for i in range(len(self.pushed))]

    def pull_messages(self, ids):
        return self.replies


def test_a_deployed_grid_packs_what_it_pushes_and_unpacks_what_it_pulls(in_a_task, caplog):
    instruction = Message(fit_content(), dst_node_id=2, message_type="train")
    good = reply_to(instruction)
    pack_content(good.content)
    bad = reply_to(instruction)
    pack_content(bad.content)
    bad.content["fitres.parameters"] = ArrayRecord(array_dict={PACKED_KEY: Array(
        dtype="", shape=(1, 1), stype="fedapps.packed:numpy.ndarray", data=b"xyz")})
    grid = Grid([good, bad])
    prompt = PromptReplies(grid)

    sent = instruction.content["fitins.parameters"]
    prompt.push_messages([instruction])
    assert grid.pushed == [[PACKED_KEY]]
    # once pushed the message holds its own record again, not the packed copy of the bytes
    assert instruction.content["fitins.parameters"] is sent
    with caplog.at_level(logging.WARNING):
        got = list(prompt.pull_messages(["0"]))
    assert is_legacy(got[0].content["fitres.parameters"])
    # the malformed one stays packed: one tensor for a model of several, rejected by its count
    assert len(arrayrecord_to_parameters(got[1].content["fitres.parameters"], keep_input=True
                                         ).tensors) == 1
    assert any("packed arrays malformed" in r.getMessage() for r in caplog.records)


def test_the_apps_clientapp_unpacks_with_the_mod():
    from fedapps.client_app import app

    assert packed_arrays_mod in app._mods
