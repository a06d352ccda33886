"""``opacus.accountants.analysis`` under dpnotebook: the RDP functions Opacus code imports (:mod:`.rdp`)."""
