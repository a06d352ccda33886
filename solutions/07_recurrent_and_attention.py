# Solutions to tutorial 07. Each block replaces the notebook cell tagged with its exercise id
# (python -m dpnotebook.exercises solve tutorials/ OUT_DIR).

# %% exercise 07.fix_gru
gru = torch.nn.GRU(8, 16, num_layers=2, batch_first=True)
fixed_gru = dpnotebook.fix(gru)                 # a copy: DPGRU, same weights
print(type(gru).__name__, "->", type(fixed_gru).__name__, "| problems left:", dpnotebook.validate(fixed_gru))
