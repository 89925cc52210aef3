"""The generated documents: man pages (``python -m docgen.manpages man``) and the flag and tree tables of README.md and
docs/ (``python -m docgen.tables``), made from the settings' declarations of arbiterd and the device plugin. Run from
the checkout; not installed."""
