"""Group-relative advantage estimators against hand-computed values."""
import numpy as np
import pytest

from composer_rl.train.advantages import ESTIMATORS, compute_advantages

# Group 0: rewards 1, 0, 0, 1 (mean 0.5, population std 0.5); group 1: 2, 2 (constant);
# group 2: a single sample (no baseline -> 0).
R = [1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 5.0]
G = [7, 7, 7, 7, 3, 3, 9]


def test_grpo_mean_std_normalized():
  a = compute_advantages("grpo", R, G, eps=1e-6)
  s = 0.5 / (0.5 + 1e-6)
  np.testing.assert_allclose(a, [s, -s, -s, s, 0.0, 0.0, 0.0], rtol=1e-6)


def test_rloo_leave_one_out():
  # r=1: others (0, 0, 1) mean 1/3 -> 2/3; r=0: others (1, 0, 1) mean 2/3 -> -2/3.
  a = compute_advantages("rloo", R, G)
  np.testing.assert_allclose(a, [2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.0, 0.0, 0.0], rtol=1e-6)


def test_dr_grpo_unnormalized():
  a = compute_advantages("dr_grpo", R, G)
  np.testing.assert_allclose(a, [0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0], rtol=1e-6)


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_padding_rows_do_not_change_group_statistics(name):
  base = compute_advantages(name, R, G)
  padded = compute_advantages(name, R + [100.0], G + [7], rows_valid=[1] * 7 + [0])
  np.testing.assert_array_equal(np.asarray(padded[:7]), np.asarray(base))
  assert padded[7] == 0.0


def test_unknown_estimator_names_the_choices():
  with pytest.raises(ValueError, match="grpo"):
    compute_advantages("ppo_gae", R, G)
