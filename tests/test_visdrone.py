"""VisDrone and the detection task (issue 15 item 1, seed 004's object-detection row): the
loader on a fixture in the release's layout, mAP-50 from additive histograms against
Ultralytics' own AP function, matching and NMS by hand, YOLOv8n's loss, and a real federated
run that scores the global detector on the official test split."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fedapps.data.datasets import check_available, load_pool
from fedapps.data.iot import visdrone
from fedapps.detection import BINS, detections, histogram, map50, true_positives
from fedapps.errors import ConfigError
from fedapps.tasks import TASKS
from tests.visdrone_fixture import IMAGES, write_fixture

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDAPPS_CACHE", str(tmp_path / "cache"))
    write_fixture(tmp_path)
    return tmp_path


def test_letterboxed_images_and_box_targets_by_hand(root):
    pool = load_pool("visdrone-320", root)
    train, test = IMAGES["VisDrone2019-DET-train"], IMAGES["VisDrone2019-DET-test-dev"]
    assert pool.x.shape == (len(train) + len(test), 3, 320, 320) and pool.x.dtype == torch.uint8
    assert pool.num_train == len(train) and pool.task == "detection" and pool.num_classes == 12
    assert pool.labels() is None and pool.normalization == "unit"
    # image 0 is 96 x 64: scale 320/96, drawn 320 x 213, 53 rows of grey above
    s, top = 320 / 96, (320 - 213) // 2
    assert pool.x[0, :, top - 1, 0].tolist() == [114, 114, 114]
    assert pool.x[0, :, 320 - 1, 0].tolist() == [114, 114, 114]
    want = [[4, (10 + 10) * s / 320, ((8 + 8) * s + top) / 320, 20 * s / 320, 16 * s / 320],
            [1, (50 + 15) * s / 320, ((30 + 10) * s + top) / 320, 30 * s / 320, 20 * s / 320]]
    assert pool.y[0].numpy() == pytest.approx(np.array(want, dtype=np.float32), abs=1e-6)
    # image 1 (64 x 64, scale 5): the zero-width box is dropped, the rest keep their order;
    # raw categories are the class ids (0 "ignored regions" and 11 "others" included, B4);
    # the box at 40..70 is clipped to the image, 40..64
    assert pool.y[1, :, 0].tolist() == [9, 4]
    assert pool.y[1, 1].numpy() == pytest.approx([4, 52 / 64, 52 / 64, 24 / 64, 24 / 64],
                                                 abs=1e-6)
    assert pool.y[2, 0, 0] == 0 and pool.y[3, 0, 0] == 11
    assert (pool.y[5, :, 0] == -1).all()  # no boxes: padding only
    # the box pixels themselves landed where the targets say (the colour of class 4)
    cx, cy = (pool.y[0, 0, 1:3] * 320).round().long().tolist()
    assert pool.x[0, :, cy, cx].tolist() != [40, 40, 40]


def test_cached_images_are_mapped_and_a_changed_annotation_rebuilds(root):
    first = load_pool("visdrone-320", root)
    cached = sorted((root / "cache" / "iot").glob("visdrone-*-x.npy"))
    assert len(cached) == 1
    again = visdrone.loader(320)(root, False)
    assert torch.equal(first.x, again.x) and torch.equal(first.y, again.y)
    note = next((root / "visdrone/VisDrone2019-DET-test-dev/annotations").glob("*.txt"))
    note.write_text("1,1,30,30,1,7,0,0\n")
    changed = visdrone.loader(320)(root, False)
    assert changed.source != first.source and changed.y[first.num_train, 0, 0] == 7


def test_download_unpacks_both_archive_shapes_into_the_layout(tmp_path, monkeypatch):
    import zipfile

    monkeypatch.setenv("FEDAPPS_CACHE", str(tmp_path / "cache"))
    source = write_fixture(tmp_path / "source")
    archives = {}
    for split, top in (("VisDrone2019-DET-train", True), ("VisDrone2019-DET-test-dev", False)):
        archive = tmp_path / f"{split}.zip"  # train with its top folder, test-dev without
        with zipfile.ZipFile(archive, "w") as z:
            for f in (source / split).rglob("*.*"):
                z.write(f, f.relative_to(source if top else source / split))
        archives[visdrone.DRIVE_IDS[split]] = archive.as_uri()
    monkeypatch.setattr(visdrone, "google_drive_url", archives.__getitem__)
    root = tmp_path / "root"
    check_available("visdrone-320", root, True)  # with download the loader fetches first
    pool = load_pool("visdrone-320", root, download=True)
    assert pool.num_train == len(IMAGES["VisDrone2019-DET-train"]) and len(pool) == 8
    assert sorted(p.name for p in (root / "visdrone").iterdir()) == [
        "VisDrone2019-DET-test-dev", "VisDrone2019-DET-train", "download.lock"]
    monkeypatch.setattr(visdrone, "google_drive_url", lambda file_id: 1 / 0)
    load_pool("visdrone-320", root, download=True)  # present: nothing fetched again


def test_missing_data_and_bad_annotations_are_one_line_errors(tmp_path, monkeypatch):
    with pytest.raises(ConfigError) as err:
        check_available("visdrone", tmp_path, False)
    text = str(err.value)
    assert "\n" not in text and "dataset visdrone not found" in text
    assert "VisDrone2019-DET-train" in text and "VisDrone-Dataset" in text
    monkeypatch.setenv("FEDAPPS_CACHE", str(tmp_path / "cache"))
    write_fixture(tmp_path)
    note = next((tmp_path / "visdrone/VisDrone2019-DET-train/annotations").glob("*.txt"))
    note.write_text("1,2,3,4,1,12,0,0\n")
    with pytest.raises(ConfigError, match="category 12 outside 0..11"):
        visdrone.loader(320)(tmp_path, False)


def needs_ultralytics() -> None:
    pytest.importorskip("ultralytics", reason="the `detection` extra (dev installs it)")


def test_map50_from_histograms_equals_ultralytics_ap_per_class():
    needs_ultralytics()
    from ultralytics.utils.metrics import ap_per_class

    rng = np.random.default_rng(0)
    for _ in range(5):
        classes, n = 4, 300
        conf = (rng.choice(BINS, n, replace=False) + 0.5) / BINS  # one detection per bin
        cls = rng.integers(0, classes, n)
        tp = rng.random(n) < 0.4
        gt = np.concatenate([cls[tp], rng.integers(0, classes, 40)])
        index = cls * BINS + np.floor(conf * BINS).astype(int)
        h = np.concatenate([np.bincount(gt, minlength=classes),
                            np.bincount(index, minlength=classes * BINS),
                            np.bincount(index[tp], minlength=classes * BINS)])
        want = ap_per_class(tp[:, None], conf, cls, gt)[5][:, 0].mean()
        assert map50(h) == pytest.approx(want, abs=1e-12)


def test_one_perfect_and_one_false_detection_by_hand():
    # class 0: a true positive at 0.9, then a false one at 0.8 -> recall 1 at precision 1;
    # the 101-point rule's last interval (recall 0.99 -> 1, where the sentinel drops the
    # precision to 0) makes that AP 0.995, as in Ultralytics; class 1: one box never
    # detected -> AP 0; mAP (0.995 + 0) / 2
    h = np.zeros(2 * (1 + 2 * BINS), dtype=np.int64)
    h[:2] = [1, 1]
    det, tp = h[2:2 + 2 * BINS], h[2 + 2 * BINS:]
    det[900] = det[800] = 1
    tp[900] = 1
    assert map50(h) == pytest.approx(0.4975, abs=1e-12)


def test_true_positives_greedy_by_iou_one_match_per_box():
    gt = torch.tensor([[0.0, 0, 10, 10], [20, 20, 30, 30]])
    gt_cls = torch.tensor([1.0, 2.0])
    dets = torch.tensor([[0, 0, 10, 9, 0.5, 1],     # IoU 0.9 with box 0
                         [0, 0, 10, 10, 0.9, 1],    # IoU 1.0 with box 0: wins it
                         [20, 20, 30, 30, 0.8, 1],  # right place, wrong class
                         [21, 21, 30, 30, 0.7, 2],  # IoU 0.81 with box 1
                         [40, 40, 50, 50, 0.6, 2]])  # nothing there
    assert true_positives(dets, gt, gt_cls).tolist() == [False, True, False, True, False]


def test_detections_keep_other_classes_and_suppress_overlaps():
    decoded = torch.zeros(1, 4 + 3, 3)
    decoded[0, :4] = torch.tensor([[10.0, 11, 40], [10, 10, 40], [8, 8, 8], [8, 8, 8]])
    decoded[0, 4:, 0] = torch.tensor([0.9, 0.0, 0.6])  # class 0 and class 2
    decoded[0, 4:, 1] = torch.tensor([0.8, 0.0, 0.0])  # overlaps anchor 0 in class 0
    decoded[0, 4:, 2] = torch.tensor([0.0, 0.0005, 0.0])  # below the confidence floor
    (dets,) = detections(decoded)
    rows = sorted((round(float(c), 4), int(k)) for c, k in dets[:, 4:6].tolist())
    assert rows == [(0.6, 2), (0.9, 0)]


def test_histograms_add_over_clients_and_tampering_is_refused():
    task = TASKS["detection"]
    torch.manual_seed(0)
    decoded = torch.rand(4, 4 + 12, 50) * torch.tensor([64.0] * 4 + [1.0] * 12)[None, :, None]
    target = torch.full((4, 3, 5), -1.0)
    target[0, 0] = torch.tensor([3, 0.5, 0.5, 0.3, 0.3])
    target[2, :2] = torch.tensor([[1, 0.2, 0.2, 0.2, 0.2], [3, 0.7, 0.6, 0.3, 0.2]])
    whole = histogram(detections(decoded), target, 64.0, 12)
    halves = histogram(detections(decoded[:2]), target[:2], 64.0, 12) \
        + histogram(detections(decoded[2:]), target[2:], 64.0, 12)
    assert torch.equal(whole, halves)
    metrics = task.to_metrics(torch.cat([whole, whole]).double().tolist())
    assert task.check_sums(4, metrics) is None
    pooled = task.reduce([(2, metrics), (2, metrics)])
    assert pooled["global_map50"] == pytest.approx(map50(2 * whole.numpy()))
    h = np.zeros(12 * (1 + 2 * BINS), dtype="<i8")
    det, tp = 12 + 3 * BINS + 900, 12 + 12 * BINS + 3 * BINS + 900  # class 3, bin 900
    h[det] = h[tp] = 1  # a true positive of class 3 ...
    assert "more true positives than ground-truth" in task.check_sums(
        4, {**metrics, "detection-global": h.tobytes()})  # ... without a class-3 box
    h[3] = 1
    assert task.check_sums(4, {**metrics, "detection-global": h.tobytes()}) is None
    h[tp] = 2
    assert "more true positives than detections" in task.check_sums(
        4, {**metrics, "detection-global": h.tobytes()})
    h[tp] = -1
    assert "negative" in task.check_sums(4, {**metrics, "detection-global": h.tobytes()})
    assert "lack" in task.check_sums(4, {"detection-global": b"123"})


def test_yolov8n_loss_reads_the_boxes_and_reaches_every_layer(root):
    needs_ultralytics()
    from fedapps.yolo import yolov8n

    pool = visdrone.loader(64)(root, False)
    torch.manual_seed(0)
    model = yolov8n((3, 64, 64), 12, 1)
    assert 3.0e6 < sum(p.numel() for p in model.parameters()) < 3.1e6  # YOLOv8n at 12 classes
    task = TASKS["detection"]
    x, y = pool.x[:6].float() / 255, pool.y[:6]
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    for _ in range(3):  # a few steps, so predictions overlap the boxes and every term counts
        opt.zero_grad()
        task.loss(model(x), y).backward()
        opt.step()
    opt.zero_grad()
    loss = task.loss(model(x), y)
    loss.backward()
    first = model.head.net.model[0].conv.weight.grad
    last = model.head.net.model[-1].cv2[0][-1].weight.grad  # a box branch of the Detect head
    assert torch.isfinite(loss) and first.abs().sum() > 0 and last.abs().sum() > 0
    without_boxes = torch.full_like(y, -1.0)
    moved = y.clone()
    moved[..., 1:3] = 1 - moved[..., 1:3]  # the same boxes mirrored
    with torch.no_grad():
        out = model(x)
        assert task.loss(out, without_boxes).item() != pytest.approx(loss.item(), rel=1e-3)
        assert task.loss(out, moved).item() != pytest.approx(loss.item(), rel=1e-3)
    model.eval()
    with torch.no_grad():
        out = model(x)
        summed = task.loss(out, y, reduction="sum")
    assert summed.item() == pytest.approx(6 * task.loss(out, y).item(), rel=1e-5)


def test_partition_report_counts_boxes_per_class(root, monkeypatch):
    from simulations.cli import partition_report

    monkeypatch.setenv("FEDAPPS_DATA_ROOT", str(root))
    report = partition_report("fedaiot-visdrone", [
        "dataset=visdrone-320", "data.partitioner=iid", "federation.num-clients=2",
        "federation.clients-per-round=2"])
    boxes = np.array(report["class_counts"])
    train = IMAGES["VisDrone2019-DET-train"]
    want = np.bincount([c for _, _, bs in train for *_, w, h, c in bs if w and h], minlength=12)
    assert report["grouping"] == "box classes" and report["sizes"] == [3, 3]
    assert boxes.sum(axis=0).tolist() == want.tolist()  # every train box, once


def test_config_refuses_detector_mismatches(root, monkeypatch):
    needs_ultralytics()  # validation refuses yolov8n without it (checked below)
    from fedapps import yolo
    from fedapps.validation import resolve_config

    raw = "data.fedaiot.cluster-features=raw"  # vgg19 (the preset's) needs the weights file
    resolve_config("fedaiot-visdrone", [raw], check_data=False)
    with pytest.raises(ConfigError, match="detection dataset: use yolov8n"):
        resolve_config("fedaiot-visdrone", [raw, "model.name=convnet"], check_data=False)
    with pytest.raises(ConfigError, match="is a detector"):
        resolve_config("quickstart", ["model.name=yolov8n"], check_data=False)
    with pytest.raises(ConfigError, match="detection"):
        resolve_config("fedaiot-visdrone", [raw, "algorithm=fedrod"], check_data=False)
    with monkeypatch.context() as m:  # a machine without the `detection` extra
        m.setattr(yolo, "ultralytics_installed", lambda: False)
        with pytest.raises(ConfigError, match="'yolov8n': needs Ultralytics: pip install"):
            resolve_config("fedaiot-visdrone", [raw], check_data=False)
    for transform, why in (("label-noise", "needs a classification dataset"),
                           ("crop-flip", "not the boxes")):
        with pytest.raises(ConfigError, match=why):
            resolve_config("fedaiot-visdrone", [raw, f"data.transforms=[{transform}]"],
                           check_data=False)


def test_federated_yolov8n_run_scores_map50_on_the_official_test_split(root, tmp_path):
    """FedOPT (FedAvg's clients, the server's Adam on the pseudo-gradient) over two clients:
    a real Flower simulation of the preset at 320 pixels; the server's official-test mAP-50
    is recorded every round."""
    needs_ultralytics()
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "simulations.cli", "run", "fedaiot-visdrone",
           "--set", "dataset=visdrone-320", "--set", "rounds=2",
           "--set", "federation.num-clients=2", "--set", "federation.clients-per-round=2",
           "--set", "train.batch-size=3", "--set", "train.lr=0.01",
           "--set", "data.partitioner=iid", "--set", "eval.eval-every=1",
           "--set", "server.optimizer=torch-adam", "--set", "server.lr=0.01",
           "--set", f"output.output-dir={out}", "--set", "output.run-name=fedopt"]
    env = {**os.environ, "FEDAPPS_DATA_ROOT": str(root)}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads((out / "fedopt" / "results.json").read_text())
    maps = [r.get("official_test_map50") for r in doc["rounds"]]
    assert len(maps) == 2 and all(m is not None and 0 <= m <= 1 for m in maps)
    assert doc["summary"]["metric"] == "map50"
    assert "official test best map50 " in done.stdout + done.stderr
    # the recorded round-2 scores are the saved global model's, scored again here
    from fedapps import checkpoint
    from fedapps.data import federated_data
    from fedapps.server_app import official_test_eval
    from fedapps.validation import resolve_config

    cfg = resolve_config("fedaiot-visdrone", [c for c in cmd[cmd.index("--set"):]
                                              if c != "--set"] + [f"data.data-root={root}"])
    again = official_test_eval(cfg, federated_data(cfg))(
        checkpoint.load(out / "fedopt").global_arrays)
    last = doc["rounds"][-1]
    assert again["official_test_map50"] == pytest.approx(last["official_test_map50"], abs=1e-12)
    assert again["official_test_loss"] == pytest.approx(last["official_test_loss"], rel=1e-6)
