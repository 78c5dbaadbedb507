"""Stored result types: verdicts and their findings, alerts, bisections, baseline cells.

Pure (pydantic only), below the store, the workflows and every renderer: the store
keeps them, the workflows produce them, reports and notifiers show them.
"""
