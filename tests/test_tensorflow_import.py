"""`tfdist.import_tensorflow`: public, defined outside ``_internal`` (the
noise filter it uses is tested in tests/_internal/test_tf_logs.py)."""


def test_import_tensorflow_is_public():
    import tfdist
    from tfdist import tensorflow_import as module

    assert "import_tensorflow" in tfdist.__all__
    assert tfdist.import_tensorflow is module.import_tensorflow
