"""Client state on disk across a crash mid-round (clients/state_files.py): a resumed run reads
the state as the checkpointed round left it, never what a round the resume redoes wrote."""

import numpy as np
import torch

from clients import state_files
from clients.base import BaseClient, TrainSettings
from strategies.plan import RESUMED_ROUND, RESUMED_STEP, WHOLE_ROUND


def arrays(v: float) -> list[np.ndarray]:
    return [np.full(3, v, dtype=np.float32), np.array([v], dtype=np.float64)]


def value(found: list[np.ndarray] | None) -> float | None:
    return None if found is None else float(found[0][0])


def test_still_valid_compares_round_then_step_against_the_resume_point():
    assert state_files.still_valid((9, 3), None)  # not resumed: everything
    assert state_files.still_valid((4, 0), (4, WHOLE_ROUND))
    assert not state_files.still_valid((5, 0), (4, WHOLE_ROUND))
    # a checkpoint inside round 5 after its step 1: steps 0-1 of round 5 count, step 2 not
    assert state_files.still_valid((5, 1), (5, 1))
    assert not state_files.still_valid((5, 2), (5, 1))
    assert state_files.still_valid((4, 7), (5, 1))


def test_a_redone_round_reads_the_generation_before_the_lost_write(tmp_path):
    state_files.save(tmp_path, "h", arrays(1.0), (1, 0))
    state_files.save(tmp_path, "h", arrays(3.0), (3, 0))  # round 3: 1.0 becomes previous
    assert value(state_files.load(tmp_path, "h")) == 3.0
    # the server checkpointed round 2 and died in round 3: round 3's write is not read
    assert value(state_files.load(tmp_path, "h", (2, WHOLE_ROUND))) == 1.0
    assert value(state_files.load(tmp_path, "h", (3, WHOLE_ROUND))) == 3.0
    # the redone round 3 writes again: the invalid generation is replaced, 1.0 stays previous
    state_files.save(tmp_path, "h", arrays(3.5), (3, 0), (2, WHOLE_ROUND))
    assert value(state_files.load(tmp_path, "h", (2, WHOLE_ROUND))) == 1.0
    # a second crash: the resume after round 3 reads 3.5, after round 2 still 1.0
    assert value(state_files.load(tmp_path, "h", (3, WHOLE_ROUND))) == 3.5
    # a client that skips the redone round and trains next in round 5 of the resumed run: the
    # lost round-3 write (3.0) must not become its previous generation
    state_files.save(tmp_path, "g", arrays(1.0), (1, 0))
    state_files.save(tmp_path, "g", arrays(3.0), (3, 0))
    state_files.save(tmp_path, "g", arrays(5.0), (5, 0), (2, WHOLE_ROUND))
    assert value(state_files.load(tmp_path, "g", (4, WHOLE_ROUND))) == 1.0
    # state first written in the lost round: nothing to read
    state_files.save(tmp_path, "new", arrays(3.0), (3, 0))
    assert state_files.load(tmp_path, "new", (2, WHOLE_ROUND)) is None
    assert state_files.load(tmp_path, "missing") is None


def test_files_without_a_clock_still_load(tmp_path):
    np.savez(tmp_path / "old.npz", *arrays(2.0))  # as written before the clock existed
    assert value(state_files.load(tmp_path, "old", (1, WHOLE_ROUND))) == 2.0
    found = state_files.load(tmp_path, "old")
    assert [a.dtype for a in found] == [np.float32, np.float64]


class Data:
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.x_train = torch.randn(32, 4, generator=g)
        self.y_train = torch.randint(0, 3, (32,), generator=g)
        self.x_test, self.y_test = self.x_train[:8], self.y_train[:8]


def make_client(state_dir):
    torch.manual_seed(0)
    settings = TrainSettings(local_epochs=1, batch_size=8, lr=0.1, momentum=0.9,
                             weight_decay=0.0, seed=0, optimizer_state="persist")
    return BaseClient(torch.nn.Linear(4, 3), Data(), settings, partition_id=0,
                      state_dir=state_dir)


def test_a_resumed_client_redoes_a_lost_round_from_its_state_before_it(tmp_path):
    """A client trains rounds 1 and 2 (its SGD momentum persisted), the server dies before
    checkpointing round 2; a fresh process (no node state in memory) redoing round 2 under
    `resumed-round 1` trains from round 1's momentum and uploads what the uninterrupted
    client uploaded in round 2."""
    client = make_client(tmp_path)
    start = [a.copy() for a in client.get_parameters({})]
    client.fit(start, {"server-round": 1})
    after_1 = [a.copy() for a in client.get_parameters({})]
    uninterrupted, _, _ = client.fit(after_1, {"server-round": 2})
    resumed = make_client(tmp_path)
    redone, _, metrics = resumed.fit(after_1, {"server-round": 2, RESUMED_ROUND: 1,
                                               RESUMED_STEP: WHOLE_ROUND})
    assert metrics["state-from-disk"] == 1
    assert all(np.array_equal(a, b) for a, b in zip(redone, uninterrupted, strict=True))
    # without the resume point the fresh process reads round 2's momentum: other numbers
    stale = make_client(tmp_path)
    wrong, _, _ = stale.fit(after_1, {"server-round": 2})
    assert not all(np.array_equal(a, b) for a, b in zip(wrong, uninterrupted, strict=True))
