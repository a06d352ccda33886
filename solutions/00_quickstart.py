# Solutions to tutorial 00. Each block replaces the notebook cell tagged with its exercise id
# (python -m dpnotebook.exercises solve tutorials/ OUT_DIR).

# %% exercise 00.smaller_budget
torch.manual_seed(0)
model2 = SmallCNN().to(device)
engine2 = PrivacyEngine(accountant="pld")
model2, optimizer2, loader2 = engine2.make_private_with_epsilon(
    module=model2, optimizer=torch.optim.Adam(model2.parameters(), lr=1e-2),
    data_loader=DataLoader(train, batch_size=128),
    target_epsilon=2.0, target_delta=1e-5, epochs=30, max_grad_norm=1.0,
    noise_generator=torch.Generator(device=device).manual_seed(0),
    sampling_generator=torch.Generator().manual_seed(1),
)
fit(model2, optimizer2, loader2, epochs=30, description="DP-SGD, epsilon 2")
print(f"accuracy at epsilon 2: {evaluate(model2, test_loader):.1%} (at epsilon 8: {private:.1%})")
