import numpy as np
import pytest

from strategies.aggregation import weighted_average


def test_weighted_average_hand_computed():
    a = [np.array([1.0, 2.0], dtype=np.float32), np.array([[0.0]], dtype=np.float32)]
    b = [np.array([3.0, 6.0], dtype=np.float32), np.array([[4.0]], dtype=np.float32)]
    out = weighted_average([a, b], [1, 3])  # (1*a + 3*b) / 4
    np.testing.assert_allclose(out[0], [2.5, 5.0])
    np.testing.assert_allclose(out[1], [[3.0]])
    assert out[0].dtype == np.float32


def test_weighted_average_keeps_integer_dtype():
    out = weighted_average([[np.array([2], dtype=np.int64)], [np.array([4], dtype=np.int64)]],
                           [1, 1])
    assert out[0].dtype == np.int64 and out[0][0] == 3


@pytest.mark.parametrize("weights", [[0, 0], [1, -1], [1]])
def test_weighted_average_rejects_bad_weights(weights):
    with pytest.raises(ValueError):
        weighted_average([[np.zeros(1)], [np.zeros(1)]], weights)
