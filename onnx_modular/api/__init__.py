"""The public entry points: om.export, om.hook, om.split, om.split_stages / om.split_by."""
