"""raypipe's samples: `samples.models` holds the user deployments the sample graphs import."""
