"""The operator's settings: one class, parsed from the environment, documented in docs/operator.md."""

from pathlib import Path

import pytest

from kvscale.control.settings import Settings, SettingsError, settings_table

ROOT = Path(__file__).resolve().parents[2]


def test_readme_table_is_generated_from_the_class() -> None:
    readme = (ROOT / "docs" / "operator.md").read_text()
    table = readme.split("<!-- settings:begin -->\n", 1)[1].split("\n<!-- settings:end -->", 1)[0]
    assert table == settings_table(), (
        "docs/operator.md's settings table drifted: paste kvscale.control.settings.settings_table()"
    )


def test_defaults_and_overrides() -> None:
    assert Settings.from_env({}) == Settings()
    s = Settings.from_env(
        {
            "KVSCALE_STATUS_INTERVAL": "1s",
            "KVSCALE_NAMESPACES": "a, b",
            "KVSCALE_PROMETHEUS_URL": "http://p:9090",
            "KVSCALE_METRICS_WINDOW": "15s",
        }
    )
    assert s.status_interval_s == 1.0 and s.namespaces == ("a", "b") and s.prometheus_url == "http://p:9090"
    assert s.metrics_window_s == 15.0 and Settings().scale_interval_s == 15.0


@pytest.mark.parametrize(
    ("env", "value"),
    [
        ("KVSCALE_STATUS_INTERVAL", "0s"),
        ("KVSCALE_STATUS_INTERVAL", "soon"),
        ("KVSCALE_ENGINE_PORT", "70000"),
        ("KVSCALE_ENGINE_PORT", "65400"),  # a decode pod's vLLM behind the routing sidecar: + 200
        ("KVSCALE_ENGINE_PORT", "0"),
        ("KVSCALE_ROUTING_SIDECAR_IMAGE", "not an image!"),
        ("KVSCALE_METRICS_WINDOW", "1.5m"),
        ("KVSCALE_LOG_LEVEL", "loud"),
        ("KVSCALE_EXTRA_TOLERATIONS", "broken"),
    ],
)
def test_bad_values_name_the_variable(env: str, value: str) -> None:
    with pytest.raises(SettingsError, match=env):
        Settings.from_env({env: value})
