"""Workflow specs: `validation` (the format, pure: it imports no model), `storage`
(versions, activation, who may load them), and the pieces specs are made of: `params`,
`values` (placeholders), `grants` (which secrets a spec may name)."""
