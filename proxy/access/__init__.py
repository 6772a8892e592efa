"""Who may call what: proxy keys, the admin key and report viewers (`auth`); the door every
request passes first (`guard`)."""
