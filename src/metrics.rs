//! Every metric name and family in one place.
