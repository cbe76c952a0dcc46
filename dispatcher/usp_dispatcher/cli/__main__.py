"""``python -m usp_dispatcher.cli``: how ``up`` starts its children."""

from .main import main

if __name__ == "__main__":
    main()
