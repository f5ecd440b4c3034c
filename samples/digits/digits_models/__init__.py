"""A team's own models, pushed with the graph as its code layer (`raypipe dag push --code`)."""
