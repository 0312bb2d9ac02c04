"""Parameter averaging's own arithmetic, without Spark: one round's merge
(:mod:`.merge`: the moment correction, block momentum, frozen ranges), the
same on the driver and on executors, and the rounds a barrier stage runs
inside itself (:mod:`.rounds`: fit, all-reduce, merge, every ``F``
minibatches)."""
from .merge import block_momentum_step, correct_moments, correct_second_moment, merge_sums, start_of

__all__ = ["block_momentum_step", "correct_moments", "correct_second_moment", "merge_sums", "start_of"]
