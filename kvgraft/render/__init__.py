"""The renderers' parts: text, numbers, tables, heat maps, HTML pieces. They know results, not check kinds."""
