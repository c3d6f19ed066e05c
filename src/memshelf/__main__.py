"""`python -m memshelf ...` runs the memshelf command, for when its script is not on PATH (a venv not activated)."""

from .cli import main

if __name__ == "__main__":
    main()
