# Solutions to tutorial 03b. Each block replaces the notebook cell tagged with its exercise id
# (python -m dpnotebook.exercises solve tutorials/ OUT_DIR).

# %% exercise 03b.rr_epsilon
def rr_epsilon(p):
    # P(yes | yes) = p + (1 - p) / 2 = (1 + p) / 2 and P(yes | no) = (1 - p) / 2; "no" is the mirror image.
    # The largest ratio of output probabilities is (1 + p) / (1 - p); at p = 1 it is 1 / 0: no epsilon.
    if p == 1:
        return math.inf
    return math.log((1 + p) / (1 - p))


# %% exercise 03b.classic_sigma
def classic_sigma(epsilon, delta, sensitivity):
    # Theorem A.1 is proved for 0 < epsilon < 1 only (at epsilon = 10 its sigma is NOT (10, delta)-DP).
    if not 0 < epsilon < 1:
        raise ValueError(f"epsilon={epsilon}: Theorem A.1 holds only for 0 < epsilon < 1")
    c = math.sqrt(2 * math.log(1.25 / delta))
    return c * sensitivity / epsilon


# %% exercise 03b.rdp_epsilon
def rdp_epsilon(k, sigma, delta):
    # eps(alpha) = k alpha / (2 sigma^2) + ln(1/delta) / (alpha - 1); its derivative in alpha vanishes at
    # alpha* = 1 + sigma sqrt(2 ln(1/delta) / k), where eps = k / (2 sigma^2) + sqrt(2 k ln(1/delta)) / sigma.
    alpha = 1 + sigma * math.sqrt(2 * math.log(1 / delta) / k)
    return k * alpha / (2 * sigma**2) + math.log(1 / delta) / (alpha - 1)


print(f"k = 100, sigma = 10: RDP (original) {rdp_epsilon(100, 10.0, 1e-5):.3f}, "
      f"exact {gaussian_epsilon(math.sqrt(100) / 10.0, 1e-5):.3f}")
