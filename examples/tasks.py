"""Job functions of the examples (a worker started in this folder imports them)."""

from __future__ import annotations


def charge_card(order_id: str, cents: int) -> str:
    """Not safe to run twice: it gets a stall budget of one."""
    return f'charged {cents} cents for {order_id}'


def make_thumbnail(name: str) -> str:
    """Idempotent: it may be retried after several worker deaths."""
    return f'thumbnail of {name}'


def send_report(period: str) -> str:
    return f'{period} report sent'
