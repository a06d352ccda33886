# Solutions to tutorial 10. Each block replaces the notebook cell tagged with its exercise id
# (python -m dpnotebook.exercises solve tutorials/ OUT_DIR).

# %% exercise 10.noise_on_average
def noise_std_on_average(batch_size, *, epsilon, epochs, C, N, delta):
    q = batch_size / N                                   # Poisson sampling rate
    sigma = get_noise_multiplier(target_epsilon=epsilon, target_delta=delta, sample_rate=q, epochs=epochs)
    return sigma * C / batch_size                        # noise N(0, (sigma C)^2) on the sum, divided by B


for B in (16, 64, 256):
    std = noise_std_on_average(B, epsilon=1.0, epochs=8, C=1.0, N=1438, delta=1e-5)
    print(f"B = {B:3d}: sigma*C/B = {std:.4f}")
