#!/usr/bin/env python3
"""Writes resources/data/regression.csv, the table that resources/examples/table-regression.json learns.

The rows are Friedman's first regression problem (J. H. Friedman, "Multivariate Adaptive Regression Splines",
Annals of Statistics 19(1), 1991; scikit-learn's make_friedman1 with n_features=6):

    x1 .. x6 ~ U(0, 1), independent
    y = 10 sin(pi x1 x2) + 20 (x3 - 0.5)^2 + 10 x4 + 5 x5 + e,   e ~ N(0, 1)

y does not depend on x6 at all: a model has to learn to ignore it. The noise has variance 1, so no model can
get the mean squared error much below 1.0, and R^2 no higher than var(f) / (var(f) + 1), where var(f) is the
variance of the noise-free part: 23.32 over this file's rows (var(y) 24.38), so the ceiling is 0.959. A
least-squares line through the six features reaches an R^2 of 0.722 on these rows, so a network that beats
that has learned the sine and the square. The script prints these numbers when it writes the file.

Pure Python and seeded (random.Random(SEED).random(), whose sequence Python keeps the same across versions,
and Box-Muller for the normal draws instead of random.gauss): the same file on every machine. Every value is
written with 6 decimals. The file is committed; tests/nodes/test_examples.cpp runs this script and checks that
it still makes exactly the committed bytes.

Usage: make_regression_table.py [OUT.csv]   (default: resources/data/regression.csv in this repository; "-" writes
       the same text to standard output, and prints nothing else)
"""
import math
import os
import random
import sys

SEED = 20240601
ROWS = 4000
FEATURES = 6
NOISE_STD = 1.0


def friedman1(x):
    return 10 * math.sin(math.pi * x[0] * x[1]) + 20 * (x[2] - 0.5) ** 2 + 10 * x[3] + 5 * x[4]


def normal(rng):
    # Box-Muller: 1 - random() is in (0, 1], so the logarithm is finite.
    u1, u2 = 1.0 - rng.random(), rng.random()
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)


def rows():
    rng = random.Random(SEED)
    out = []
    for _ in range(ROWS):
        x = [rng.random() for _ in range(FEATURES)]
        f = friedman1(x)
        out.append((x, f, f + NOISE_STD * normal(rng)))
    return out


def csv_text(table):
    lines = [",".join(["x%d" % (i + 1) for i in range(FEATURES)] + ["y"])]
    for x, _, y in table:
        lines.append(",".join("%.6f" % v for v in x + [y]))
    return "\n".join(lines) + "\n"


def variance(values):
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / len(values)


def linear_r2(table):
    # Least squares y ~ 1 + x1 .. x6 through the normal equations, solved by Gaussian elimination.
    n = FEATURES + 1
    a = [[0.0] * n for _ in range(n)]
    b = [0.0] * n
    for x, _, y in table:
        z = [1.0] + x
        for i in range(n):
            b[i] += z[i] * y
            for j in range(n):
                a[i][j] += z[i] * z[j]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(a[r][c]))
        a[c], a[p], b[c], b[p] = a[p], a[c], b[p], b[c]
        for r in range(c + 1, n):
            k = a[r][c] / a[c][c]
            for j in range(c, n):
                a[r][j] -= k * a[c][j]
            b[r] -= k * b[c]
    w = [0.0] * n
    for r in reversed(range(n)):
        w[r] = (b[r] - sum(a[r][j] * w[j] for j in range(r + 1, n))) / a[r][r]
    ys = [y for _, _, y in table]
    sse = sum((y - sum(wi * zi for wi, zi in zip(w, [1.0] + x))) ** 2 for x, _, y in table)
    return 1 - sse / (variance(ys) * len(ys))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default = os.path.normpath(os.path.join(here, "..", "resources", "data", "regression.csv"))
    out = sys.argv[1] if len(sys.argv) > 1 else default
    table = rows()
    text = csv_text(table)
    if out == "-":
        sys.stdout.write(text)
        return
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w", encoding="ascii", newline="\n") as f:
        f.write(text)
    var_f = variance([f for _, f, _ in table])
    var_y = variance([y for _, _, y in table])
    print("%s: %d rows, var(f) %.2f, var(y) %.2f, noise variance %.2f, best R^2 %.3f, least-squares line R^2 %.3f"
          % (out, len(table), var_f, var_y, NOISE_STD ** 2, var_f / (var_f + NOISE_STD ** 2), linear_r2(table)))


if __name__ == "__main__":
    main()
