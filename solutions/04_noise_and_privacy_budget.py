# Solutions to tutorial 04. Each block replaces the notebook cell tagged with its exercise id
# (python -m dpnotebook.exercises solve tutorials/ OUT_DIR).

# %% exercise 04.sigma_for_budget
from dpnotebook.privacy import steps_for_epochs, steps_per_epoch

q = 64 / 1438
sigma = get_noise_multiplier(target_epsilon=1.0, target_delta=1e-5, sample_rate=q, epochs=20)
steps = steps_for_epochs(20, steps_per_epoch(q))         # what 20 epochs of a Poisson loader run
epsilon_spent = compute_epsilon(noise_multiplier=sigma, sample_rate=q, steps=steps, delta=1e-5, accountant="pld")
print(f"sigma = {sigma:.2f}: epsilon = {epsilon_spent:.3f} after {steps} steps")
