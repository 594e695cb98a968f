"""Object detection scoring (seed 004's VisDrone row: mAP-50) as additive per-client sums.

mAP needs every detection of every image ranked by confidence, which a client cannot send as a
fixed set of sums. So each predictor's detections are counted in a histogram over (class,
confidence bin): detections and true positives per bin, plus ground-truth boxes per class.
Histograms add over images, batches and clients, and the precision-recall curve of a class is
read from them bin by bin, from the highest confidence down. With at most one detection of a
class per bin this is exactly the per-detection curve that Ultralytics' `ap_per_class` builds
(tests/test_visdrone.py checks it against that function); detections that share a bin
(confidence within 1/BINS) enter the curve together.

The steps follow Ultralytics' detection validator (read, not copied): multi-label candidates
above CONF, class-wise NMS at IoU NMS_IOU, at most MAX_DET per image; a detection is a true
positive when it overlaps an unmatched ground-truth box of its class at IoU >= 0.5 (greedy by
IoU); AP is the area under the precision envelope with COCO's 101-point interpolation; mAP-50
is the mean AP over the classes that have ground-truth boxes.

Targets are padded per image: [M, 5] rows (class, cx, cy, w, h), box coordinates as fractions
of the image side, rows with class < 0 are padding.
"""

from __future__ import annotations

import numpy as np
import torch
from torchvision.ops import batched_nms, box_iou

BINS = 1000  # confidence resolution of the histograms
CONF = 0.001  # Ultralytics' validation confidence threshold
NMS_IOU = 0.7  # Ultralytics' validation NMS IoU
MAX_DET = 300
MAX_CANDIDATES = 30000  # top-scoring (box, class) pairs entering NMS
MATCH_IOU = 0.5


def xywh_to_xyxy(boxes: torch.Tensor) -> torch.Tensor:
    """Centre-size boxes [..., 4] as corner boxes."""
    xy, wh = boxes[..., :2], boxes[..., 2:4] / 2
    return torch.cat([xy - wh, xy + wh], dim=-1)


def detections(decoded: torch.Tensor) -> list[torch.Tensor]:
    """Per image [n, 6] rows (x1, y1, x2, y2, confidence, class) from a YOLO head's decoded
    output [B, 4 + C, anchors] (centre-size boxes in pixels, class probabilities)."""
    out = []
    for pred in decoded.float():
        boxes, scores = xywh_to_xyxy(pred[:4].T), pred[4:].T  # [A, 4], [A, C]
        anchor, cls = torch.nonzero(scores > CONF, as_tuple=True)
        conf = scores[anchor, cls]
        if len(conf) > MAX_CANDIDATES:
            conf, top = conf.topk(MAX_CANDIDATES)
            anchor, cls = anchor[top], cls[top]
        keep = batched_nms(boxes[anchor], conf, cls, NMS_IOU)[:MAX_DET]
        out.append(torch.cat([boxes[anchor[keep]], conf[keep, None],
                              cls[keep, None].to(conf.dtype)], dim=1))
    return out


def true_positives(dets: torch.Tensor, gt_boxes: torch.Tensor, gt_cls: torch.Tensor,
                   iou: float = MATCH_IOU) -> torch.Tensor:
    """Bool [n]: which detections match a ground-truth box of their class at IoU >= iou, each
    box matched once, pairs taken in decreasing IoU (ties: the lower index first)."""
    tp = torch.zeros(len(dets), dtype=torch.bool, device=dets.device)
    if not len(dets) or not len(gt_boxes):
        return tp
    overlap = box_iou(gt_boxes, dets[:, :4]) * (gt_cls[:, None] == dets[None, :, 5])
    gt_i, det_i = torch.nonzero(overlap >= iou, as_tuple=True)
    if not len(gt_i):
        return tp
    order = torch.argsort(overlap[gt_i, det_i], descending=True, stable=True)
    used_gt: set[int] = set()
    matched: set[int] = set()
    for g, d in zip(gt_i[order].tolist(), det_i[order].tolist(), strict=True):
        if g not in used_gt and d not in matched:
            used_gt.add(g)
            matched.add(d)
    tp[sorted(matched)] = True
    return tp


def histogram(dets_per_image: list[torch.Tensor], target: torch.Tensor, image_size: float,
              num_classes: int) -> torch.Tensor:
    """int64 [C + 2 C BINS]: ground-truth boxes per class, then detections and true positives
    per (class, confidence bin), of a batch's detections against its padded targets."""
    c = num_classes
    dev = target.device
    valid = target[..., 0] >= 0
    gt_per_class = torch.bincount(target[..., 0][valid].long(), minlength=c)[:c]
    index, hits = [], []
    for dets, t, v in zip(dets_per_image, target, valid, strict=True):
        gt_boxes = xywh_to_xyxy(t[v, 1:5].float() * image_size)
        tp = true_positives(dets, gt_boxes, t[v, 0].to(dets.dtype))
        bins = (dets[:, 4] * BINS).long().clamp(0, BINS - 1)
        index.append(dets[:, 5].long() * BINS + bins)
        hits.append(tp)
    idx = torch.cat(index) if index else torch.zeros(0, dtype=torch.long, device=dev)
    tp_all = torch.cat(hits) if hits else torch.zeros(0, dtype=torch.bool, device=dev)
    detected = torch.bincount(idx, minlength=c * BINS)
    matched = torch.bincount(idx[tp_all], minlength=c * BINS)
    return torch.cat([gt_per_class, detected, matched])


def split_histogram(h: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(gt [C], detected [C, BINS], matched [C, BINS]) of a histogram vector, C from its size;
    a vector of another size is a ValueError."""
    h = np.asarray(h)
    c = len(h) // (1 + 2 * BINS)
    if c < 1 or len(h) != c * (1 + 2 * BINS):
        raise ValueError(f"detection histogram of {len(h)} counts: not C (1 + 2 x {BINS})")
    return h[:c], h[c:c + c * BINS].reshape(c, BINS), h[c + c * BINS:].reshape(c, BINS)


def average_precision(recall: np.ndarray, precision: np.ndarray) -> float:
    """Area under the precision envelope, COCO's 101-point interpolation, with the sentinels
    Ultralytics' compute_ap adds (recall 0 at precision 1; precision 0 after the last recall
    and at recall 1)."""
    last = recall[-1] if len(recall) else 1.0
    mrec = np.concatenate(([0.0], recall, [last], [1.0]))
    mpre = np.concatenate(([1.0], precision, [0.0], [0.0]))
    mpre = np.flip(np.maximum.accumulate(np.flip(mpre)))
    x = np.linspace(0, 1, 101)
    y = np.interp(x, mrec, mpre)
    return float(np.sum((y[1:] + y[:-1]) / 2 * np.diff(x)))  # the trapezoid rule


def map50(h: np.ndarray) -> float | None:
    """mAP-50 of a histogram vector: mean AP over classes with ground truth (None: none); a
    class never detected scores 0."""
    gt, detected, matched = split_histogram(h)
    aps = []
    for c in np.flatnonzero(gt > 0):
        if not detected[c].any():
            aps.append(0.0)
            continue
        seen = detected[c][::-1] > 0  # bins from the highest confidence down, non-empty only
        tpc = np.cumsum(matched[c][::-1])[seen].astype(np.float64)
        fpc = np.cumsum(detected[c][::-1] - matched[c][::-1])[seen].astype(np.float64)
        aps.append(average_precision(tpc / gt[c], tpc / np.maximum(tpc + fpc, 1)))
    return float(np.mean(aps)) if aps else None


def histogram_problem(h: np.ndarray) -> str | None:
    """Why a histogram cannot come from scoring detections, or None: counts >= 0, true
    positives <= detections per bin and <= ground-truth boxes per class."""
    try:
        gt, detected, matched = split_histogram(h)
    except ValueError as err:
        return str(err)
    if min(gt.min(), detected.min(), matched.min()) < 0:
        return "negative counts"
    if (matched > detected).any():
        return "more true positives than detections in a bin"
    if (matched.sum(axis=1) > gt).any():
        return "more true positives than ground-truth boxes in a class"
    return None
