"""The `norm-fusion` rules (apsat/rules/norm-fusion.egg): RMSNorm as transformers exports
it becomes `rms-norm`, soundly (harness tolerance rtol 1e-4 / atol 1e-5), and look-alikes
(another exponent, the mean over another axis) are refused."""

from harness import check_reaches, check_refuses, check_sound

SHAPES = {"x": (1, 5, 8)}
X = "(access (access-tensor x) 3)"


def lit(value: float, reshape: str = "(shape 1 1 1)", target: str = "(shape 1 5 8)") -> str:
    return (f"(access-broadcast (access-reshape (access-literal {value}) (access-shape {reshape} (shape))) "
            f"(access-shape {target} (shape)))")


def rms(power: float = 2.0, axis: int = 2, eps: float = 1e-6) -> str:
    """x * 1 / sqrt(mean(x ** power over `axis`.. ) + eps), as the importer writes it."""
    mean_shape = "(shape 1 5 1)" if axis == 2 else "(shape 1 1 1)"
    mean = (f"(access-reshape (compute reduce-mean (access (compute elementwise-pow (access-pair {X} {lit(power)})) {axis})) "
            f"(access-shape {mean_shape} (shape)))")
    small = lambda v: lit(v, target=mean_shape)   # noqa: E731
    inv = (f"(compute elementwise-div (access-pair {small(1.0)} (compute sqrt (compute elementwise-add "
           f"(access-pair {mean} {small(eps)})))))")
    return f"(compute elementwise-mul (access-pair {X} (access-broadcast {inv} (access-shape (shape 1 5 8) (shape)))))"


def test_rms_sound_and_reach():
    assert check_sound("norm-fusion/rms", rms(), SHAPES) >= 2
    check_reaches("norm-fusion/rms", rms(), SHAPES, "(access (compute (rms-norm 1e-06) (access ?x 2)) 3)")


def test_rms_refuses_another_power():
    check_refuses("norm-fusion/rms", rms(power=3.0), SHAPES)


def test_rms_refuses_a_mean_over_more_than_the_last_axis():
    check_refuses("norm-fusion/rms", rms(axis=1), SHAPES)
