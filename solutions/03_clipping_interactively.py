# Solutions to tutorial 03. Each block replaces the notebook cell tagged with its exercise id
# (python -m dpnotebook.exercises solve tutorials/ OUT_DIR).

# %% exercise 03.clipping_bound
def smallest_bound(grads, grid, max_fraction):
    """The smallest C in grid that clips at most max_fraction of the samples."""
    for C in grid:                      # increasing: the first that qualifies is the smallest
        if clipping_stats(grads, C).fraction_clipped <= max_fraction:
            return C
    return grid[-1]
