"""``opacus.accountants.analysis`` under dpnotebook (:mod:`.rdp`)."""
