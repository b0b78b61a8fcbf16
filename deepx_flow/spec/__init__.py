"""The YAML graph spec: the cross-language protocol for tensor graphs."""
