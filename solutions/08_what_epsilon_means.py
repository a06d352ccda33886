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
    # the lines TPR = e^eps FPR + delta and 1 - TPR = e^-eps (1 - FPR - delta) cross at
    # FPR = (1 - delta) / (e^eps + 1), where
    # TPR - FPR = (e^eps - 1 + 2 delta) / (e^eps + 1); set that to the margin and solve for eps
    return math.log((1 + margin - 2 * delta) / (1 - margin))

# %% exercise 08.epsilon_from_attack
def epsilon_from_attack(tp, members, fp, nonmembers, delta):
    tpr_low, _ = clopper_pearson(tp, members, 0.95)     # each end fails with probability 2.5%:
    _, fpr_high = clopper_pearson(fp, nonmembers, 0.95)  # both together with at most 5%
    refuted = [0.0]
    if tpr_low > delta:                                  # TPR <= e^eps FPR + delta
        refuted.append(math.log((tpr_low - delta) / fpr_high))
    if tpr_low < 1 and 1 - fpr_high - delta > 0:         # 1 - TPR >= e^-eps (1 - FPR - delta)
        refuted.append(math.log((1 - fpr_high - delta) / (1 - tpr_low)))
    return max(refuted)
