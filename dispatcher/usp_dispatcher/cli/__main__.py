"""``python -m usp_dispatcher.cli``: how ``up`` starts its children."""

from usp_dispatcher.cli.main import main

if __name__ == "__main__":
    main()
