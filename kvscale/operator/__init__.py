"""The kopf operator: thin handlers over pure planning and builders of child objects."""
