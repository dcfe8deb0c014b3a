"""Reads an example's --model_dir with TensorBoard's EventAccumulator and checks that the
standard session's summaries are there: the given scalar tags (each with increasing steps,
finite values), a histogram per variable, and (optionally) summaries up to a global step.

    check_logdir.py <model_dir> <min_last_step> <scalar tag>...
"""
import math
import sys

from tensorboard.backend.event_processing import event_accumulator


def fail(message):
    print("check_logdir: FAIL: " + message)
    sys.exit(1)


def main():
    logdir, min_last_step, scalars = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    acc = event_accumulator.EventAccumulator(
        logdir, size_guidance={event_accumulator.SCALARS: 0, event_accumulator.HISTOGRAMS: 0})
    acc.Reload()
    tags = acc.Tags()
    for tag in scalars:
        if tag not in tags["scalars"]:
            fail("scalar %r missing; the run has %r" % (tag, sorted(tags["scalars"])))
        events = acc.Scalars(tag)
        steps = [e.step for e in events]
        if steps != sorted(steps) or len(set(steps)) != len(steps):
            fail("scalar %r steps are not increasing: %r" % (tag, steps))
        if not all(math.isfinite(e.value) for e in events):
            fail("scalar %r has non-finite values" % tag)
        print("check_logdir: %-18s %3d points, steps %d..%d, last %.4g" % (tag, len(events), steps[0], steps[-1],
                                                                         events[-1].value))
    kernels = [t for t in tags["histograms"] if t.endswith("/kernel")]
    if len(kernels) < 2:
        fail("expected a histogram per dense kernel, have %r" % tags["histograms"])
    for tag in tags["histograms"]:
        h = acc.Histograms(tag)[-1].histogram_value
        if h.num <= 0 or sum(h.bucket) != h.num or not h.min <= h.max:
            fail("histogram %r is malformed: num %r buckets %r" % (tag, h.num, h.bucket))
    print("check_logdir: %d histograms ok" % len(tags["histograms"]))
    last = max(e.step for e in acc.Scalars("loss"))
    if last < min_last_step:
        fail("the last loss summary is at step %d, expected at least %d" % (last, min_last_step))
    print("check_logdir: OK")


if __name__ == "__main__":
    main()
