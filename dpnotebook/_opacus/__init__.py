"""Opacus compatibility, kept apart: Opacus' names and signatures over dpnotebook's own machinery.

An Opacus script changes only its imports (``opacus`` -> ``dpnotebook``). The Opacus module paths
(``dpnotebook.accountants``, ``.optimizers``, ``.validators``, ``.utils``, ``.grad_sample.utils``,
``.privacy_engine``, ``.data_loader``, ``.schedulers``) are thin re-exports of the modules here; the rest of
the package does not know about Opacus (``tests/compat/test_core_is_opacus_free.py``). What differs, and why,
is in ``docs/migration-from-opacus.md``.
"""
