# Solutions to tutorial 11. Each block replaces the notebook cell tagged with its exercise id
# (python -m dpnotebook.exercises solve tutorials/ OUT_DIR).

# %% exercise 11.not_public
q_pre = 64 / len(public_train)
steps_pre = steps_for_epochs(20, steps_per_epoch(q_pre))          # what a Poisson loader runs in 20 epochs
epsilon_pretrain = compute_epsilon(noise_multiplier=4.0, sample_rate=q_pre, steps=steps_pre, delta=1e-5)

last = results["last"][0]
q_ft = last.setting.batch_size / len(private_train)
epsilon_fine_tune = compute_epsilon(noise_multiplier=last.noise_multiplier, sample_rate=q_ft, steps=last.steps,
                                    delta=1e-5)
# each person is in one part: only one phase sees them (the other is post-processing): the worst of the two
epsilon_disjoint = max(epsilon_pretrain, epsilon_fine_tune)

# the same people in both parts: both phases see them; one accountant composes the two phases
accountant = create_accountant("pld")
accountant.step(noise_multiplier=4.0, sample_rate=q_pre, num_steps=steps_pre)
accountant.step(noise_multiplier=last.noise_multiplier, sample_rate=q_ft, num_steps=last.steps)
epsilon_same_people = accountant.get_epsilon(1e-5)
print(f"pretraining {epsilon_pretrain:.2f}, fine-tune {epsilon_fine_tune:.2f}: disjoint {epsilon_disjoint:.2f}, "
      f"same people {epsilon_same_people:.2f} (the sum would be {epsilon_pretrain + epsilon_fine_tune:.2f})")
