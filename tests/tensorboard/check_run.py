"""Reads a run written by dtf (write_run) with TensorBoard's own event reader and compares
tags, steps and values with what the writer recorded in expected.json.

    check_run.py <out_dir>
"""
import json
import math
import sys

from tensorboard.backend.event_processing import event_accumulator


def fail(message):
    print("check_run: FAIL: " + message)
    sys.exit(1)


def close(a, b, rel=1e-6, abs_tol=1e-6):
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_tol)


def main():
    out = sys.argv[1]
    with open(out + "/expected.json") as f:
        expected = json.load(f)
    acc = event_accumulator.EventAccumulator(
        out + "/logdir", size_guidance={event_accumulator.SCALARS: 0, event_accumulator.HISTOGRAMS: 0})
    acc.Reload()
    tags = acc.Tags()
    print("check_run: tags", json.dumps({k: v for k, v in tags.items() if v}, sort_keys=True))

    for tag, points in expected["scalars"].items():
        if tag not in tags["scalars"]:
            fail("scalar tag %r missing (have %r)" % (tag, tags["scalars"]))
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        if [s for s, _ in got] != [p[0] for p in points]:
            fail("scalar %r steps %r, expected %r" % (tag, [s for s, _ in got], [p[0] for p in points]))
        for (step, value), (_, want) in zip(got, points):
            # simple_value is a float32: compare at float32 precision.
            if not close(value, want, rel=1e-6, abs_tol=1e-7):
                fail("scalar %r at step %d is %r, expected %r" % (tag, step, value, want))
        print("check_run: scalar %-16s %d points, steps %s..%s ok" % (tag, len(got), got[0][0], got[-1][0]))

    rate = [(e.step, e.value) for e in acc.Scalars("global_step/sec")] if "global_step/sec" in tags["scalars"] else []
    if len(rate) != expected["step_counter_measurements"] or not rate:
        fail("global_step/sec has %d points, expected %d" % (len(rate), expected["step_counter_measurements"]))
    if any(step % 20 != 0 or not value > 0 for step, value in rate):
        fail("global_step/sec points %r: steps must be multiples of 20, rates positive" % rate)
    print("check_run: scalar global_step/sec  %d points ok" % len(rate))

    for tag, points in expected["histograms"].items():
        if tag not in tags["histograms"]:
            fail("histogram tag %r missing (have %r)" % (tag, tags["histograms"]))
        got = acc.Histograms(tag)
        if [h.step for h in got] != [p[0] for p in points]:
            fail("histogram %r steps %r, expected %r" % (tag, [h.step for h in got], [p[0] for p in points]))
        for h, (step, num, total, lo, hi) in zip(got, points):
            v = h.histogram_value
            if v.num != num or not close(v.sum, total, rel=1e-9, abs_tol=1e-9) or v.min != lo or v.max != hi:
                fail("histogram %r at step %d: num %r sum %r min %r max %r, expected %r %r %r %r"
                     % (tag, step, v.num, v.sum, v.min, v.max, num, total, lo, hi))
            if sum(v.bucket) != num or len(v.bucket) != len(v.bucket_limit) or v.bucket_limit[-1] != hi:
                fail("histogram %r at step %d: buckets %r limits %r do not hold %d values up to %r"
                     % (tag, step, v.bucket, v.bucket_limit, num, hi))
        print("check_run: histogram %-14s %d points ok" % (tag, len(got)))
    print("check_run: OK")


if __name__ == "__main__":
    main()
