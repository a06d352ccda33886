# Solutions to tutorial 05. Each block replaces the notebook cell tagged with its exercise id
# (python -m dpnotebook.exercises solve tutorials/ OUT_DIR).

# %% exercise 05.epsilon_any_K
steps = 50 * len(loader)           # a Poisson loader runs len(loader) batches per epoch, whatever K is
my_epsilon = dpnotebook.compute_epsilon(noise_multiplier=1.2, sample_rate=128 / len(train), steps=steps, delta=1e-5)
print(f"{steps} steps: epsilon = {my_epsilon:.2f} (25 epochs: {engine.get_epsilon(1e-5):.2f}); K appears nowhere")
