"""The execution scheduler: clusters, input binding, submitting plans and gathering results."""
