"""The labels room: SetFit beside headstore's label heads on the same few-shot splits (`cli setfit-compare`)."""
