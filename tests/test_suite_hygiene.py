"""The suite bounds every test in time: a hanging test (or subprocess) fails instead of holding CI."""


def test_every_test_runs_under_pytest_timeout(request):
    assert request.config.pluginmanager.hasplugin("timeout"), "pytest-timeout (test extra) is not installed"
    assert float(request.config.getini("timeout")) == 1200
    assert request.node.get_closest_marker("timeout") is None  # the ini's bound applies, not a per-test one
