# Solutions to tutorial 08. Each block replaces the notebook cell tagged with its exercise id
# (python -m dpnotebook.exercises solve tutorials/ OUT_DIR).

# %% exercise 08.best_threshold
def best_threshold(member_scores, nonmember_scores):
    candidates = np.concatenate([np.unique(np.concatenate([member_scores, nonmember_scores])), [np.inf]])
    tpr = (member_scores[None, :] >= candidates[:, None]).mean(axis=1)     # members at or above each t
    fpr = (nonmember_scores[None, :] >= candidates[:, None]).mean(axis=1)  # non-members at or above each t
    return float(candidates[np.argmax(tpr - fpr)])

# %% exercise 08.epsilon_for_margin
def epsilon_for_margin(margin, delta):
    # the lines TPR = e^eps FPR + delta and 1 - FPR = e^-eps (1 - TPR - delta) cross where
    # TPR - FPR = (e^eps - 1 + 2 delta) / (e^eps + 1); set that to the margin and solve for eps
    return math.log((1 + margin - 2 * delta) / (1 - margin))
