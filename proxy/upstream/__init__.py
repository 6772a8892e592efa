"""Talking to providers: HTTP (`http`), litellm routes (`litellm`), and deep recall's query
rewriter (`rewrite`)."""
