"""Placeholder replaced below."""


def main() -> None:
    print("workflow-engine")
