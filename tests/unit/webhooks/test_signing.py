"""Standard Webhooks signing: the spec's test vector, and a real receiver that verifies with the shared secret."""

from __future__ import annotations

import asyncio
import time
import urllib.request

import pytest

from correlator.config import RetryPolicy
from correlator.sinks.webhooks.delivery import Deliverer
from correlator.sinks.webhooks.notification import Notification
from correlator.sinks.webhooks.receivers import build_receiver
from correlator.sinks.webhooks.receivers.generic_json import decode_secret, generate_secret, sign, verify
from tests.fixtures.http_receiver import HttpReceiver
from tests.unit.webhooks.incidents import make_incident

# Published with the Standard Webhooks reference libraries.
SPEC_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SPEC_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SPEC_TIMESTAMP = 1614265330
SPEC_BODY = b'{"test": 2432232314}'
SPEC_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_signature_reproduces_the_spec_test_vector() -> None:
    assert sign(decode_secret(SPEC_SECRET), SPEC_ID, SPEC_TIMESTAMP, SPEC_BODY) == SPEC_SIGNATURE


def test_verify_accepts_the_vector_and_rejects_tampering_old_stamps_and_wrong_keys() -> None:
    key = decode_secret(SPEC_SECRET)
    headers = {"webhook-id": SPEC_ID, "webhook-timestamp": str(SPEC_TIMESTAMP), "webhook-signature": SPEC_SIGNATURE}
    assert verify(key, headers, SPEC_BODY, now=SPEC_TIMESTAMP + 10)
    # several signatures, one valid (key rotation)
    assert verify(key, {**headers, "webhook-signature": "v1,bm9wZQ== " + SPEC_SIGNATURE}, SPEC_BODY, now=SPEC_TIMESTAMP)
    assert not verify(key, headers, b'{"test": 2432232315}', now=SPEC_TIMESTAMP)
    assert not verify(key, headers, SPEC_BODY, now=SPEC_TIMESTAMP + 301)
    assert not verify(decode_secret(generate_secret()), headers, SPEC_BODY, now=SPEC_TIMESTAMP)
    assert not verify(key, {**headers, "webhook-id": "msg_other"}, SPEC_BODY, now=SPEC_TIMESTAMP)
    assert not verify(key, {"webhook-id": SPEC_ID}, SPEC_BODY, now=SPEC_TIMESTAMP)


@pytest.mark.parametrize(
    ("secret", "problem"),
    [
        ("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "must start with"),
        ("whsec_not*base64!", "not valid base64"),
        ("whsec_c2hvcnQ=", "bytes"),
    ],
)
def test_bad_secrets_are_refused_without_echoing_them(secret: str, problem: str) -> None:
    with pytest.raises(ValueError) as err:
        build_receiver("audit", {"kind": "generic_json", "url": "https://example.com/h", "secret": secret})
    assert problem in str(err.value)
    assert secret not in str(err.value)


def test_receiver_verifies_with_the_shared_secret_and_a_tampered_body_fails(http_receiver: HttpReceiver) -> None:
    secret = generate_secret()
    http_receiver.expect_secret(secret)
    receiver = build_receiver("audit", {"kind": "generic_json", "url": http_receiver.url("/signed"), "secret": secret})
    request = receiver.render(Notification.for_incident(make_incident(), None))

    async def deliver() -> None:
        deliverer = Deliverer(RetryPolicy(max_attempts=1))
        try:
            result = await deliverer.deliver(request, "inc-1:1", "audit", receiver.display_target())
        finally:
            await deliverer.close()
        assert result.delivered

    asyncio.run(deliver())
    [genuine] = http_receiver.wait_for(1)
    assert genuine.signature_valid is True and genuine.status == 200
    assert genuine.webhook_id == "inc-1:1"

    # Replay the genuine headers with one byte of the body changed: the receiver must refuse it.
    tampered_body = genuine.body.replace(b"rank 11", b"rank 12", 1)
    assert tampered_body != genuine.body
    forged = urllib.request.Request(
        http_receiver.url("/signed"),
        data=tampered_body,
        method="POST",
        headers={name: genuine.headers[name] for name in ("webhook-id", "webhook-timestamp", "webhook-signature")},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(forged, timeout=5)
    assert refused.value.code == 401
    tampered = http_receiver.requests[-1]
    assert tampered.signature_valid is False

    # And a delivery signed with a different secret fails verification too.
    other = build_receiver(
        "audit", {"kind": "generic_json", "url": http_receiver.url("/signed"), "secret": generate_secret()}
    )

    async def deliver_wrong() -> None:
        deliverer = Deliverer(RetryPolicy(max_attempts=1))
        try:
            result = await deliverer.deliver(
                other.render(Notification.for_incident(make_incident(), None)), "inc-1:1", "audit", "x"
            )
        finally:
            await deliverer.close()
        assert not result.delivered and result.reason == "final answer 401"

    asyncio.run(deliver_wrong())
    assert http_receiver.requests[-1].signature_valid is False
    assert abs(int(genuine.headers["webhook-timestamp"]) - time.time()) < 60
