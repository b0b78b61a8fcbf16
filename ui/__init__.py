"""The Panel dashboard (built in a later issue); reads the metadata database only."""
