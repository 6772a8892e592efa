"""Config: the schema (`schema`), the file and its discovery (`file`), values derived for
requests (`settings`), and `database.url`'s pool (`database`)."""
