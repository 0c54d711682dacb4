#!/usr/bin/env python3
"""Reference PSNR and SSIM values for tests/media/metrics_test.cpp, in plain float64 Python.

Independent of the C++ code: SSIM here follows scikit-image's structural_similarity with
gaussian_weights=True, sigma=1.5, use_sample_covariance=False, data_range=255, channel_axis=-1
the long way: a full 2-D 11x11 Gaussian window (outer product of scipy's truncate=3.5 kernel),
scipy.ndimage's 'reflect' border mode for every pixel, the SSIM map cropped by 5 pixels, the
mean per channel, then the mean over channels. (The C++ code uses a separable filter on the
valid region only.) No numpy needed. When numpy and scikit-image are importable, the script
also prints skimage's own values as a cross-check.

Run:  python3 tests/media/reference_metrics.py     (prints the C++ table to paste)
The synthetic images are generated identically by make_case() in metrics_test.cpp.
"""
import math


class Lcg:
    """The test's deterministic byte source: s = (s * 1103515245 + 12345) mod 2^31."""

    def __init__(self, seed):
        self.s = seed

    def next_byte(self):
        self.s = (self.s * 1103515245 + 12345) & 0x7FFFFFFF
        return (self.s >> 16) & 0xFF


def make_case(name):
    """Returns (w, h, a, b); a and b are lists [y][x][c] of ints in 0..255."""
    if name == "gradient_noise":
        w, h = 16, 16
        g = Lcg(1)
        a = [[[(8 * x + 5 * y + 60 * c) % 256 for c in range(3)] for x in range(w)] for y in range(h)]
        b = [[[min(255, max(0, a[y][x][c] + g.next_byte() % 41 - 20)) for c in range(3)]
              for x in range(w)] for y in range(h)]
    elif name == "random_pair":
        w, h = 23, 17
        g1, g2 = Lcg(7), Lcg(11)
        a = [[[g1.next_byte() for c in range(3)] for x in range(w)] for y in range(h)]
        b = [[[g2.next_byte() for c in range(3)] for x in range(w)] for y in range(h)]
    elif name == "contrast":
        w, h = 32, 24
        a = [[[(200 if (x // 4 + y // 4) % 2 else 40) + 10 * c for c in range(3)] for x in range(w)]
             for y in range(h)]
        b = [[[(a[y][x][c] + 128) // 2 for c in range(3)] for x in range(w)] for y in range(h)]
    elif name == "shift":
        w, h = 20, 20
        g = Lcg(3)
        a = [[[(g.next_byte() + 4 * x + 2 * y) % 256 for c in range(3)] for x in range(w)] for y in range(h)]
        b = [[[a[y][(x + 1) % w][c] for c in range(3)] for x in range(w)] for y in range(h)]
    else:
        raise ValueError(name)
    return w, h, a, b


CASES = ["gradient_noise", "random_pair", "contrast", "shift"]


def psnr(w, h, a, b):
    se = sum((a[y][x][c] - b[y][x][c]) ** 2 for y in range(h) for x in range(w) for c in range(3))
    mse = se / (w * h * 3)
    return math.inf if mse == 0 else 10.0 * math.log10(255.0 ** 2 / mse)


def reflect(i, n):
    """scipy.ndimage mode='reflect' (d c b a | a b c d | d c b a), for any i."""
    period = 2 * n
    i %= period
    return i if i < n else period - 1 - i


def gaussian_window():
    sigma, truncate = 1.5, 3.5
    r = int(truncate * sigma + 0.5)
    k = [math.exp(-0.5 * (i * i) / (sigma * sigma)) for i in range(-r, r + 1)]
    s = sum(k)
    k = [v / s for v in k]
    return r, [[k[i] * k[j] for j in range(2 * r + 1)] for i in range(2 * r + 1)]


def ssim_channel(w, h, p, q):
    r, win = gaussian_window()
    C1 = (0.01 * 255) ** 2
    C2 = (0.03 * 255) ** 2
    total, count = 0.0, 0
    for y in range(h):
        for x in range(w):
            ux = uy = uxx = uyy = uxy = 0.0
            for dy in range(-r, r + 1):
                yy = reflect(y + dy, h)
                row_w = win[dy + r]
                for dx in range(-r, r + 1):
                    xx = reflect(x + dx, w)
                    g = row_w[dx + r]
                    u, v = float(p[yy][xx]), float(q[yy][xx])
                    ux += g * u
                    uy += g * v
                    uxx += g * u * u
                    uyy += g * v * v
                    uxy += g * u * v
            vx, vy, vxy = uxx - ux * ux, uyy - uy * uy, uxy - ux * uy
            s = ((2 * ux * uy + C1) * (2 * vxy + C2)) / ((ux * ux + uy * uy + C1) * (vx + vy + C2))
            if r <= y < h - r and r <= x < w - r:  # skimage's crop(S, pad)
                total += s
                count += 1
    return total / count


def ssim(w, h, a, b):
    vals = []
    for c in range(3):
        p = [[a[y][x][c] for x in range(w)] for y in range(h)]
        q = [[b[y][x][c] for x in range(w)] for y in range(h)]
        vals.append(ssim_channel(w, h, p, q))
    return sum(vals) / 3.0


def skimage_cross_check(w, h, a, b):
    try:
        import numpy as np
        from skimage.metrics import structural_similarity, peak_signal_noise_ratio
    except ImportError:
        return None
    A = np.array(a, dtype=np.uint8)
    B = np.array(b, dtype=np.uint8)
    s = structural_similarity(A, B, gaussian_weights=True, sigma=1.5, use_sample_covariance=False,
                              data_range=255, channel_axis=-1)
    p = peak_signal_noise_ratio(A, B, data_range=255)
    return p, s


def main():
    print("// Generated by tests/media/reference_metrics.py")
    for name in CASES:
        w, h, a, b = make_case(name)
        p, s = psnr(w, h, a, b), ssim(w, h, a, b)
        print('    {"%s", %.17g, %.17g},' % (name, p, s))
        check = skimage_cross_check(w, h, a, b)
        if check is not None:
            print("    // skimage: psnr %.17g ssim %.17g (|d ssim| = %.3g)" % (check[0], check[1], abs(check[1] - s)))


if __name__ == "__main__":
    main()
