# Solutions to tutorial 10. Each block replaces the notebook cell tagged with its exercise id
# (python -m dpnotebook.exercises solve tutorials/ OUT_DIR).

# %% exercise 10.noise_on_average
def noise_std_at_fixed_steps(batch_size, *, epsilon, steps, C, N, delta):
    q = batch_size / N                                   # Poisson sampling rate
    sigma = get_noise_multiplier(target_epsilon=epsilon, target_delta=delta, sample_rate=q, steps=steps)
    return sigma * C / batch_size                        # noise N(0, (sigma C)^2) on the sum, divided by B


setting = dict(epsilon=1.0, steps=180, C=1.0, N=N, delta=DELTA)
for B in (16, 64, 256):
    print(f"B = {B:3d}, 180 steps: sigma*C/B = {noise_std_at_fixed_steps(B, **setting):.4f}")
advantage = noise_std_at_fixed_steps(64, **setting) / noise_std_at_fixed_steps(256, **setting)
print(f"B = 64 is {advantage:.2f} times noisier than B = 256 at a fixed number of steps")
