"""The redaction of credentials out of texts: values go, the words that name them stay."""

from __future__ import annotations

import logging

from exporter.core.redact import SECRET, RedactingFilter, redact_text, redact_url


class TestRedactText:
    def test_our_own_prose_about_tokens_is_left_as_written(self):
        for text in [
            "require a bearer token on every POST",
            "auth: Bearer token required",
            "Basic auth needs a password",
            "the token env var is unset",
        ]:
            assert redact_text(text) == text

    def test_credential_values_after_the_scheme_are_redacted(self):
        assert redact_text("sent Bearer scrape-secret-123 to x") == f"sent Bearer {SECRET} to x"
        assert redact_text("Basic dXNlcjpwYXNz") == f"Basic {SECRET}"
        assert redact_text("bearer abc.def") == f"bearer {SECRET}"
        assert redact_text("Bearer abcDEF") == f"Bearer {SECRET}"

    def test_header_values_and_userinfo_are_redacted(self):
        assert redact_text("{'Authorization': 'Bearer tok'}") == f"{{'Authorization': '{SECRET}'}}"
        assert redact_text("GET http://u:p@host/metrics") == f"GET http://{SECRET}@host/metrics"
        assert redact_url("http://u:p@h:1/m") == f"http://{SECRET}@h:1/m"

    def test_known_secrets_go_wherever_they_appear(self):
        assert redact_text("value hunter22 seen", ["hunter22"]) == f"value {SECRET} seen"


def test_the_log_filter_keeps_our_message_about_bearer_tokens():
    record = logging.LogRecord("x", logging.INFO, __file__, 1,
                               "auth on: require a bearer token on every POST (%s)",
                               ("Bearer s3cr3t",), None)
    assert RedactingFilter().filter(record)
    assert record.getMessage() == f"auth on: require a bearer token on every POST (Bearer {SECRET})"
