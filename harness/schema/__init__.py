"""Every on-disk format as a versioned pydantic model, torch-free, unknown keys refused.

`SCHEMAS` names each format's JSON Schema (`dcpqual schema NAME`, committed as schemas/NAME.json).
"""

from harness.schema.registry import SCHEMAS, SchemaSpec, schema_text

__all__ = ["SCHEMAS", "SchemaSpec", "schema_text"]
