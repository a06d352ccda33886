# Solutions to tutorial 06. Each block replaces the notebook cell tagged with its exercise id
# (python -m dpnotebook.exercises solve tutorials/ OUT_DIR).

# %% exercise 06.embedding_bag_modes
rows = compare_modes(bag_model, words, labels, repeats=1)
for r in rows:
    print(f"{r.mode:10s} agrees: {r.agrees}  {r.error}")
works = {r.mode for r in rows if r.agrees and r.mode != "oracle"}
refusals = {r.mode: r.error for r in rows if not r.agrees}
